"""The configuration, as a leaf package: every section's dataclass, the run config that composes
them, the loader (presets <- TOML file <- overrides), the presets (TOML data) and the layout rules
that are functions of the configuration alone.

It imports nothing from the rest of hlat but hlat.errors and hlat.toml_value, so every layer
(model, data, parallel, train, the commands) can read its settings without an import running back
up the layers, and a configuration is checked whole before any process group exists. Chosen over
a dataclass beside each component (with the composite read only by the commands) because
validation, the layout rules and `hlat plan` need every section together, before any component is
built: one package holds them, as torchtitan's configuration does.
"""
