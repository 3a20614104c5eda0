"""The driver's public API: names, attributes and opaque configuration models shared with the controller."""
