"""The error every check of a config raises (its own module: the schema and the registries both raise
it, and the schema reads the registries)."""


class ConfigError(ValueError):
    """A config file or override that does not fit the schema."""
