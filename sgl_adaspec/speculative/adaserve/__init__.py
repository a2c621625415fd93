"""The adaserve policy (`policy.AdaservePolicy`) and the parts only it uses: its flags
(`config`), the cost rule's gain table and planner (`gain_table`, `planner`), the plans' track
records (`track_record`), the knee rule's tree shape (`knee_shape`, AdaServe eq. 8-9), the
pricing of its plans on the measured models (`pricing`, the policy's parent class) and the
modes its drafts move through (`modes`)."""
