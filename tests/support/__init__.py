"""Helpers the test modules share: servers, shoppers, buyers, clocks and observers."""
