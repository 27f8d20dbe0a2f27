"""The built-in live dashboard (`GET /dashboard`)."""

from gateway.dashboard.routes import dashboard_routes

__all__ = ["dashboard_routes"]
