"""Small helpers the whole package shares: statistics (`stats`), progress bars (`progress`)."""
