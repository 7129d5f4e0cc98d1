"""Search: text embeddings and the pieces built on them."""
