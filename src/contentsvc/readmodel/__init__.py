"""The read side: the read tables' fold (shared by the read-model projector and the
commands' inline fold) and the authorized views over them, one module per resource."""
