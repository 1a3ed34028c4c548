"""An eager copy and a replay copy stepping together over scheduled steps, checked after every
step."""
