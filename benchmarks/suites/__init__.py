"""One module per comparison; each has ``run(ctx) -> list[Group]``."""
