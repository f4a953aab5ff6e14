"""The web view (`hoist web`): fleet, sessions, pulls live in a browser, over NATS only."""
