"""Adapters to training frameworks (verl)."""
