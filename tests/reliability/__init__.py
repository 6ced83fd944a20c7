"""Reliability suite: faults, crashes, forks and bad input against every real store."""
