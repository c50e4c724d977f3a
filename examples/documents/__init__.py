"""The document archive example: ingest a folder, OCR, index, search, delete (see README.md)."""
