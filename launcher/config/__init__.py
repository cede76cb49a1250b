"""Config: the plan as a DeepSpeed ds_config (rendered from templates/, validated against the JSON Schema and
DeepSpeed's own models), and a user's own ds_config linted and merged over it.
"""
