"""The mail index worker example: index and delete jobs for a folder of mail (see README.md)."""
