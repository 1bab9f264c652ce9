"""The configs' presets as package functions: `sft.get_config(preset)`, `grpo.get_config(preset)`,
`eval.get_config(preset)` return the ml_collections ConfigDict of each command line, preset "tiny"
(CPU, the tiny model) or "qwen3_5_9b" (the real recipe). configs/*.py are thin files that name
them for `--config=configs/<mode>.py[:preset]`; code that needs a config (the GRPO warm start's SFT)
calls these functions, never a file by path."""
