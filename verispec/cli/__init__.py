"""The command line (`verispec`): the commands (main.py) and the flags they share (args.py).
`python -m verispec.cli` runs the same as `verispec`."""
