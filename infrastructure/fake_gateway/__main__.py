"""`python -m infrastructure.fake_gateway`: as `provisioner fake-gateway`."""

from infrastructure.fake_gateway.cli import serve

serve(prog_name="python -m infrastructure.fake_gateway")
