"""``python -m examples.fastapi_upload [--host H] [--port P]``: serve the upload API with uvicorn.

Run a worker beside it: ``pgtasks -A examples.fastapi_upload.app:tasks worker -Q ocr``.
"""

from __future__ import annotations

import argparse

import uvicorn

from examples.fastapi_upload.app import create_api


def main() -> None:
    """Parse the arguments and serve until interrupted."""
    parser = argparse.ArgumentParser(prog="python -m examples.fastapi_upload", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    options = parser.parse_args()
    uvicorn.run(create_api(), host=options.host, port=options.port)


if __name__ == "__main__":
    main()
