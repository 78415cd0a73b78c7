"""Reliability and security campaigns (issue 6): crash, corruption, hostile input, archives,
network faults and concurrency.

Each campaign lives in its own module as a plain function ``run(trials, seed, work) ->
CampaignResult`` so that the fast subsets (``test_*.py``, in the normal test suite) and the full
campaigns (``python -m tests.reliability.campaigns``, which also rewrites the table in
``docs/RELIABILITY.md``) run the very same code.
"""
