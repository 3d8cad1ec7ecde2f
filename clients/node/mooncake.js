// A mooncake-store client in JavaScript, over gRPC alone (see docs/PROTOCOL.md).
//
// put: MasterService.PutStart -> DataService.Write to every replica's node -> MasterService.PutEnd
// get: MasterService.GetReplicaList -> DataService.Read from a replica's node (the node checks
//      the stored checksum before it sends a byte, so no xxh3 is needed here).
// 64-bit integers (sizes, offsets, checksums, segment ids) travel as decimal strings
// (proto-loader's `longs: String`), never as JavaScript numbers, which lose bits above 2^53.
'use strict';

const path = require('path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const PROTO = path.join(__dirname, '..', '..', 'proto', 'mooncake_store.proto');
const CHUNK = 1 << 20;
const MAX_MESSAGE = 64 * 1024 * 1024;

const definition = protoLoader.loadSync(PROTO, {
  keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const v1 = grpc.loadPackageDefinition(definition).mooncake_store.v1;
const OPTIONS = {
  'grpc.max_send_message_length': MAX_MESSAGE,
  'grpc.max_receive_message_length': MAX_MESSAGE,
};

class MooncakeError extends Error {
  constructor(status, what) {
    super(`${what}: ${status.message} (code ${status.code})`);
    this.code = status.code;
  }
}

// One convention: a missing status, a status without code and code 0 all mean success.
function ok(status) {
  return !status || !status.code;
}

function check(status, what) {
  if (!ok(status)) throw new MooncakeError(status, what);
}

function unary(client, method, request, metadata) {
  return new Promise((resolve, reject) => {
    const md = metadata || new grpc.Metadata();
    client[method](request, md, { deadline: Date.now() + 30000 }, (err, reply) => {
      if (err) reject(err); else resolve(reply);
    });
  });
}

class Client {
  // `token`: the client token the master's auth asks for (default: $MOONCAKE_TOKEN), sent as
  // `authorization: Bearer <token>` on master calls; the nodes check the grants instead.
  constructor(master, { token = process.env.MOONCAKE_TOKEN } = {}) {
    this.master = new v1.MasterService(master, grpc.credentials.createInsecure(), OPTIONS);
    this.nodes = new Map();
    this.metadata = new grpc.Metadata();
    if (token) {
      const presented = token.trim().split('.').slice(0, 3).join('.');
      this.metadata.set('authorization', `Bearer ${presented}`);
    }
  }

  call(method, request) {
    return unary(this.master, method, request, this.metadata);
  }

  node(endpoint) {
    if (!this.nodes.has(endpoint)) {
      this.nodes.set(endpoint,
        new v1.DataService(endpoint, grpc.credentials.createInsecure(), OPTIONS));
    }
    return this.nodes.get(endpoint);
  }

  // Store `value` (a Buffer) under `key`; resolves to the number of replicas committed.
  async put(key, value, replicas = 1) {
    const start = await this.call('PutStart',
      { key, size_bytes: String(value.length), replicas });
    check(start.status, `PutStart ${key}`);
    if (start.already_exists) return 0;
    // The put's generation, as its write grants carry it (a little-endian u64 at byte 33):
    // PutEnd and PutRevoke name it, so that a late one never ends a later put of the key.
    const generation = start.replicas.length
      ? Buffer.from(start.replicas[0].grant).readBigUInt64LE(33).toString() : '0';
    let checksum = null;
    try {
      for (const loc of start.replicas) {
        const digest = await this.write(loc, value);
        if (checksum !== null && digest !== checksum) {
          throw new Error(`replicas of ${key} got different checksums`);
        }
        checksum = digest;
      }
    } catch (err) {
      await this.call('BatchPutRevoke', { keys: [key], generations: [generation] });
      throw err;
    }
    const end = await this.call('PutEnd', { key, checksum, generation });
    check(end.status, `PutEnd ${key}`);
    return end.replicas;
  }

  write(loc, value) {
    return new Promise((resolve, reject) => {
      const call = this.node(loc.grpc_endpoint).Write(
        { deadline: Date.now() + 60000 },
        (err, result) => {
          if (err) return reject(err);
          if (!ok(result.status)) return reject(new MooncakeError(result.status, 'Write'));
          resolve(result.checksum_str);
        });
      call.write({ grant: loc.grant, offset: loc.offset, size_bytes: String(value.length),
                   data: value.subarray(0, CHUNK) });
      for (let i = CHUNK; i < value.length; i += CHUNK) {
        call.write({ data: value.subarray(i, i + CHUNK) });
      }
      call.end();
    });
  }

  // The value of `key` as a Buffer; tries each replica in turn.
  async get(key) {
    const reply = await this.call('GetReplicaList', { key });
    check(reply.status, `GetReplicaList ${key}`);
    let last = null;
    for (const loc of reply.replicas) {
      try {
        return await this.read(loc, reply.size_bytes, reply.checksum);
      } catch (err) {
        last = err;
      }
    }
    throw last || new Error(`no replica of ${key}`);
  }

  read(loc, size, checksum) {
    return new Promise((resolve, reject) => {
      const parts = [];
      let status = null;
      const call = this.node(loc.grpc_endpoint).Read(
        { grant: loc.grant, offset: loc.offset, size_bytes: size, checksum_str: checksum },
        { deadline: Date.now() + 60000 });
      call.on('data', (chunk) => {
        if (chunk.data.length) parts.push(chunk.data);
        if (chunk.status) status = chunk.status;
      });
      call.on('error', reject);
      call.on('end', () => {
        if (!ok(status)) return reject(new MooncakeError(status, 'Read'));
        const value = Buffer.concat(parts);
        if (String(value.length) !== String(size)) {
          return reject(new Error(`Read returned ${value.length} of ${size} bytes`));
        }
        resolve(value);
      });
    });
  }

  close() {
    this.master.close();
    for (const node of this.nodes.values()) node.close();
  }
}

module.exports = { Client, MooncakeError, ok };
