// The conformance run the Python test drives (tests/integration/test_node_client.py):
//   node conformance.js MASTER PLAN.json
// PLAN: { "read": {key: sha256hex, ...},  "write": [{"key": k, "size": n}, ...] }
// Reads every "read" key (written by the Python SDK) and checks its sha256; writes random
// values for the "write" keys for Python to read back. Prints one JSON object: the sha256 of
// every key it wrote, the keys it read and checked, and the failures.
'use strict';

const crypto = require('crypto');
const fs = require('fs');
const { Client } = require('./mooncake');

async function main() {
  const [master, planPath] = process.argv.slice(2);
  const plan = JSON.parse(fs.readFileSync(planPath, 'utf8'));
  const client = new Client(master);
  const out = { read: [], written: {}, failures: [] };
  try {
    for (const [key, want] of Object.entries(plan.read)) {
      try {
        const value = await client.get(key);
        const got = crypto.createHash('sha256').update(value).digest('hex');
        if (got === want) out.read.push(key);
        else out.failures.push(`${key}: sha256 ${got}, want ${want}`);
      } catch (err) {
        out.failures.push(`${key}: ${err.message}`);
      }
    }
    for (const { key, size, replicas } of plan.write) {
      const value = crypto.randomBytes(size);
      try {
        await client.put(key, value, replicas || 1);
        out.written[key] = crypto.createHash('sha256').update(value).digest('hex');
      } catch (err) {
        out.failures.push(`${key}: ${err.message}`);
      }
    }
    try {
      await client.get(plan.missing || 'conformance/never-written');
      out.failures.push('a missing key was read');
    } catch (err) {
      out.missing_error = err.code === undefined ? String(err.message) : err.code;
    }
  } finally {
    client.close();
  }
  process.stdout.write(JSON.stringify(out) + '\n');
}

main().catch((err) => {
  process.stderr.write(`${err.stack}\n`);
  process.exit(1);
});
