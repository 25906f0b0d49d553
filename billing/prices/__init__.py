"""What things cost: the versioned price book, pricing in integer nano-USD, money
formatting, and billing periods."""
