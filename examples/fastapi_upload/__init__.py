"""Document uploads over HTTP with FastAPI: the document row and its OCR job in one transaction."""
