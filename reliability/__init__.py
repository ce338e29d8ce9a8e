"""Reliability and security suite: faults, races, bad input, leaks, tampering, noise (``make reliability``)."""
