"""Where bytes live: the PostgreSQL connection (embedded or configured), the SQL migrations, the blob store."""
