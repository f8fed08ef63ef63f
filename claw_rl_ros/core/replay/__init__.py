"""Record and replay: MCAP recordings of the deploy loop and their offline replay."""
