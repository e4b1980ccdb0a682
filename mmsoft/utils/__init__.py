"""mmsoft's utilities that know nothing of its models."""
