"""`provisioner web`: the operator's read-only pages (Starlette + Jinja2, served by uvicorn)."""
