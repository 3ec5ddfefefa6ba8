"""The `provisioner` command line: one module per group of commands; what they share with
the web view is in worker/console.py.
"""
