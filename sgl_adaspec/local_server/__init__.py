"""A real SGLang server on this machine and its HTTP clients, for the demo, the evaluation tool,
the benchmarks and the tests: `launch` starts and stops one with the CPU recipe's flags,
`client` streams and times requests, `burst` sends many and accounts for every one."""
