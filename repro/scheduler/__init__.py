"""Request sequences and the scheduler that turns them into steps."""
