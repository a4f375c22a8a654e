// A js-libp2p peer (libp2p 3.3.11, @libp2p/gossipsub 17.1.1) against a chatsync node.
// Driven by bench/js_peer.py:  node peer.js MODE 'CONFIG-JSON'
// Prints one JSON object per line ({"event": ...}); exits 1 on an unexpected error.
//
// MODE gossip  — an honest peer: listens, dials `target` if given, subscribes to the ops topic,
//                publishes `publish` (hex gossip messages) once the node is subscribed, and
//                prints every message it receives.
// Hostile modes (tests/interop/test_libp2p_hostile.py, `chatsync bench hostile`):
//   cycles  — dial and hang up `count` times;
//   probe   — dial once, report whether the connection is still open a moment later;
//   silent  — hold `streams` sync streams open, sending nothing; reopen each when it closes;
//   nosync  — `peers` peers that speak no sync protocol stay connected (redial when dropped);
//   replay  — publish the same held op (`data`) at `rate` messages/s;
//   flood   — `connections` peers connect, hold the connections `holdSeconds`, then drop them.
if (typeof Promise.withResolvers !== 'function') {
    // Node 20 lacks it; libp2p 3 calls it
    Promise.withResolvers = function () {
        let resolve, reject;
        const promise = new Promise((res, rej) => ((resolve = res), (reject = rej)));
        return { promise, resolve, reject };
    };
}

const { createLibp2p } = await import('libp2p');
const { tcp } = await import('@libp2p/tcp');
const { noise } = await import('@chainsafe/libp2p-noise');
const { yamux } = await import('@chainsafe/libp2p-yamux');
const { mplex } = await import('@libp2p/mplex');
const { identify } = await import('@libp2p/identify');
const { gossipsub } = await import('@libp2p/gossipsub');
const { multiaddr } = await import('@multiformats/multiaddr');

const [mode, configText] = process.argv.slice(2);
const config = JSON.parse(configText || '{}');
const TOPIC = config.topic || 'chatsync/ops/1';
const SYNC_PROTOCOL = '/chatsync/sync/1';

function say(event, fields = {}) {
    console.log(JSON.stringify({ event, ...fields }));
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const hex = (bytes) => Buffer.from(bytes).toString('hex');
const target = () => multiaddr(config.target);

async function newPeer({ listen = false, pubsub = false } = {}) {
    const services = { identify: identify() };
    if (pubsub) {
        // chatsync signs its messages (StrictSign); publishing to a topic with no peer yet is fine
        services.pubsub = gossipsub({ allowPublishToZeroTopicPeers: true, emitSelf: false });
    }
    return createLibp2p({
        addresses: { listen: listen ? ['/ip4/127.0.0.1/tcp/0'] : [] },
        transports: [tcp()],
        connectionEncrypters: [noise()],
        streamMuxers: [config.muxer === 'mplex' ? mplex() : yamux()],
        // the hostile modes open many connections from one process: no limit of ours may hide
        // the node's behaviour
        connectionManager: { maxConnections: 10_000, maxIncomingPendingConnections: 10_000 },
        services,
    });
}

// The node's subscription to the topic, seen by our gossipsub: then our messages reach it.
async function untilSubscribed(peer, seconds) {
    const deadline = Date.now() + seconds * 1000;
    while (Date.now() < deadline) {
        if (peer.services.pubsub.getSubscribers(TOPIC).length > 0) return true;
        await sleep(100);
    }
    return false;
}

async function gossipMode() {
    const peer = await newPeer({ listen: true, pubsub: true });
    say('listening', { peerId: peer.peerId.toString(), addr: peer.getMultiaddrs()[0].toString() });
    peer.addEventListener('peer:connect', (e) => say('connected', { peer: e.detail.toString() }));
    peer.services.pubsub.addEventListener('message', (e) => {
        if (e.detail.topic !== TOPIC) return;
        say('received', { data: hex(e.detail.data), from: e.detail.from?.toString() });
    });
    peer.services.pubsub.subscribe(TOPIC);
    if (config.target) await peer.dial(target());
    const subscribed = await untilSubscribed(peer, config.seconds || 30);
    say('subscribed', { ok: subscribed });
    // the mesh forms at the next heartbeats (1 s here, 1 s on the node): graft before publishing
    await sleep(1500);
    say('mesh', { peers: peer.services.pubsub.getMeshPeers(TOPIC).map(String) });
    for (const data of config.publish || []) {
        const result = await peer.services.pubsub.publish(TOPIC, Buffer.from(data, 'hex'));
        say('published', { recipients: result.recipients.length });
    }
    await sleep((config.seconds || 30) * 1000);
    await peer.stop();
}

async function cyclesMode() {
    const peer = await newPeer();
    let failed = 0;
    let lastError = null;
    for (let i = 1; i <= config.count; i++) {
        try {
            const connection = await peer.dial(target(), { signal: AbortSignal.timeout(5000) });
            await connection.close();
        } catch (err) {
            failed++;
            lastError = String(err);
        }
        if (i % 100 === 0) say('progress', { done: i, failed });
    }
    say('cycles', { count: config.count, failed, lastError });
    await peer.stop();
}

async function probeMode() {
    const peer = await newPeer();
    let connected = false;
    let error = null;
    try {
        const connection = await peer.dial(target(), { signal: AbortSignal.timeout(5000) });
        await sleep(config.holdMs ?? 1000); // a node that refuses hangs up right after the handshake
        connected = connection.status === 'open';
    } catch (err) {
        error = String(err);
    }
    say('probe', { connected, error });
    await peer.stop();
}

async function silentMode() {
    const peer = await newPeer();
    let opened = 0;
    let failures = 0;
    const stopAt = Date.now() + config.seconds * 1000;
    // one loop per held stream: open it, send nothing, wait for the node to close it, reopen
    async function hold() {
        while (Date.now() < stopAt) {
            try {
                const stream = await peer.dialProtocol(target(), SYNC_PROTOCOL, {
                    signal: AbortSignal.timeout(5000),
                });
                opened++;
                if (opened === config.streams) say('holding', { streams: config.streams, opened });
                stream.inactivityTimeout = 0; // our side never gives up on it
                // the node ends a session by closing its side (an ABORT, then its half-close)
                const ended = new Promise((resolve) => {
                    stream.addEventListener('close', resolve);
                    stream.addEventListener('remoteCloseWrite', resolve);
                });
                await Promise.race([ended, sleep(stopAt - Date.now())]);
                stream.abort(new Error('reopening'));
            } catch {
                failures++;
            }
            await sleep(50); // reopen at once, but let the event loop breathe
        }
    }
    const report = setInterval(() => say('progress', { opened, failures }), 5000);
    await Promise.all(Array.from({ length: config.streams }, hold));
    clearInterval(report);
    say('silent', { opened, failures });
    await peer.stop();
}

// Many peers, each dialling the target once and keeping (or redialling) its connection.
async function connectMany(count, { redial }) {
    const peers = await Promise.all(Array.from({ length: count }, () => newPeer()));
    let failures = 0;
    async function connect(peer) {
        try {
            await peer.dial(target(), { signal: AbortSignal.timeout(10_000) });
        } catch {
            failures++;
        }
    }
    for (let i = 0; i < peers.length; i += 25) await Promise.all(peers.slice(i, i + 25).map(connect));
    if (redial) {
        for (const peer of peers) {
            peer.addEventListener('peer:disconnect', () => setTimeout(() => connect(peer), 1000));
        }
    }
    const open = () => peers.filter((p) => p.getConnections().length > 0).length;
    return { peers, open, failures: () => failures };
}

async function nosyncMode() {
    const many = await connectMany(config.peers, { redial: true });
    say('connected', { open: many.open(), failures: many.failures() });
    await sleep(config.seconds * 1000);
    say('nosync', { open: many.open(), failures: many.failures() });
    await Promise.all(many.peers.map((p) => p.stop()));
}

async function floodMode() {
    const many = await connectMany(config.connections, { redial: false });
    say('held', { open: many.open(), failures: many.failures() });
    await sleep(config.holdSeconds * 1000);
    const open = many.open();
    await Promise.all(many.peers.map((p) => p.stop()));
    say('dropped', { openUntilTheEnd: open });
}

async function replayMode() {
    const peer = await newPeer({ pubsub: true });
    let disconnected = false;
    peer.addEventListener('peer:disconnect', () => (disconnected = true));
    peer.services.pubsub.subscribe(TOPIC);
    await peer.dial(target());
    say('subscribed', { ok: await untilSubscribed(peer, 30) });
    await sleep(1500); // let the mesh form
    const data = Buffer.from(config.data, 'hex');
    const stopAt = Date.now() + config.seconds * 1000;
    const gapMs = 1000 / config.rate;
    let published = 0;
    let refused = 0;
    while (Date.now() < stopAt) {
        // the same op bytes each time; gossipsub's message id (sender + seqno) is new each time,
        // so every copy passes the node's seen cache and reaches its validator
        try {
            await peer.services.pubsub.publish(TOPIC, data);
            published++;
        } catch {
            refused++; // no peer left to send to: the node hung up or pruned us
        }
        await sleep(gapMs);
    }
    say('replay', { published, refused, disconnected, stillConnected: peer.getConnections().length > 0 });
    await peer.stop();
}

const modes = {
    gossip: gossipMode,
    cycles: cyclesMode,
    probe: probeMode,
    silent: silentMode,
    nosync: nosyncMode,
    replay: replayMode,
    flood: floodMode,
};
if (!modes[mode]) {
    say('error', { error: `unknown mode ${mode}; one of ${Object.keys(modes).join(', ')}` });
    process.exit(2);
}
try {
    await modes[mode]();
    process.exit(0); // libp2p may leave timers behind
} catch (err) {
    say('error', { error: String(err), stack: err.stack });
    process.exit(1);
}
