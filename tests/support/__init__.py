"""Helpers the tests share (fixtures, cases, stand-ins), imported as tests.support.<module>."""
