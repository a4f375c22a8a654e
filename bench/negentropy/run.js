// One negentropy reconciliation (the reference implementation beside it, Negentropy.js, MIT),
// in memory: the client holds the items of argv[2], the server those of argv[3]; each file is
// records of 8 bytes timestamp (big-endian) + 32 bytes id. Prints one JSON line: the bytes both
// ways, the round trips (messages the client sent) and the sizes of have/need.
const fs = require("fs");
const { Negentropy, NegentropyStorageVector } = require("./Negentropy.js");

function storage(path) {
    const buf = fs.readFileSync(path);
    const s = new NegentropyStorageVector();
    for (let off = 0; off < buf.length; off += 40) {
        s.insert(Number(buf.readBigUInt64BE(off)), buf.subarray(off + 8, off + 40));
    }
    s.seal();
    return s;
}

async function main() {
    const frameLimit = Number(process.argv[4] || 0);
    const client = new Negentropy(storage(process.argv[2]), frameLimit);
    const server = new Negentropy(storage(process.argv[3]), frameLimit);
    client.wantUint8ArrayOutput = true;
    server.wantUint8ArrayOutput = true;
    const started = process.hrtime.bigint();
    let bytes = 0, roundTrips = 0, have = 0, need = 0;
    let msg = await client.initiate();
    while (msg !== null) {
        roundTrips += 1;
        bytes += msg.length;
        const [reply] = await server.reconcile(msg);
        bytes += reply.length;
        const [next, haveIds, needIds] = await client.reconcile(reply);
        have += haveIds.length;
        need += needIds.length;
        msg = next;
    }
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    console.log(JSON.stringify({ bytes, round_trips: roundTrips, have, need, ms }));
}

main().catch((e) => { console.error(e); process.exit(1); });
