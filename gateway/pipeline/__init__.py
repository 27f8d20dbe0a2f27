"""The one path every proxied request takes (`steps.py`): orchestration of the plug-ins
over the request context and record that live in `gateway.core`."""
