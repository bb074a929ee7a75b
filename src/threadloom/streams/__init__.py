"""Live streams: wake-ups between processes, an in-process hub, and gapless log readers."""
