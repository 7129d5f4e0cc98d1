"""Part 2 slice: plugins as separate processes over HTTP (registration, contract checks, activation,
immutable plans). Holds its routes, commands, events, views and workers."""
