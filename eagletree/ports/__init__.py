"""Ports: typing.Protocol contracts between the application and its adapters."""
