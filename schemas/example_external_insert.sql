-- Two jobs inserted the way an external producer would, with plain SQL and only the columns it
-- needs; every other column takes its default. Run it with: sqlite3 jobs.db < this-file
INSERT INTO jobs (client_key, batch_id, prompt, max_tokens, temperature)
VALUES ('nightly-report-0001', 'nightly-report', 'Summarize the causes of the 1929 crash.', 200, 0.7);
INSERT INTO jobs (client_key, batch_id, priority, prompt_kind, prompt, max_tokens, stop)
VALUES ('nightly-report-0002', 'nightly-report', 5, 'chat',
        '[{"role":"system","content":"Answer in one line."},{"role":"user","content":"What is a mixture of experts?"}]',
        64, '["\n\n"]');
