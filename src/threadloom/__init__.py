"""Threadloom: a GraphQL service that orchestrates coding-agent conversations."""

__version__ = "0.1.0"
