"""relax-retry: a wrong answer gets feedback and another attempt."""
