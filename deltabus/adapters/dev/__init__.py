"""Local development servers: MinIO, PostgreSQL and OpenSearch processes, and their stacks."""
