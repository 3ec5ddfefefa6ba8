"""`python -m infrastructure.fake_gateway`: as `provisioner fake-gateway`."""

import logging

from infrastructure.fake_gateway.cli import serve

logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s %(message)s")  # its stop line
serve(prog_name="python -m infrastructure.fake_gateway")
