"""Platform enablement: what SGLang lacks on a device, supplied by the plugin."""
