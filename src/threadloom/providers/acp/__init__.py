"""The `acp` provider driver: any Agent Client Protocol agent (docs/providers.md, "ACP")."""

from threadloom.providers.acp.driver import AcpDriver

__all__ = ["AcpDriver"]
