// A dm3 client made of the real dm3 libraries (@dm3-org/* 1.7.1), talking to chatsync nodes.
// Driven by tests/interop/test_dm3_js.py:  node dm3_client.js <submit|fetch|open> CONFIG.json
// Prints one JSON object per line; exits 1 on the first expectation that fails.
//
// ENS cannot run here (no chain): the provider below answers the two ENS text records dm3
// reads — a delivery service's `network.dm3.deliveryService` — from the config, as data: URIs.
// Everything else is the libraries' own code: envelopes, encryption, signatures, the
// delivery-service client with its fallback to the next service when one is down.
'use strict';
if (typeof Promise.withResolvers !== 'function') {
    // Node 20 lacks it; some of the libraries' dependencies call it
    Promise.withResolvers = function () {
        let resolve, reject;
        const promise = new Promise((res, rej) => ((resolve = res), (reject = rej)));
        return { promise, resolve, reject };
    };
}
process.env.REACT_APP_BACKEND = ''; // the delivery-api paths are '/auth', '/delivery', '/rpc'

const fs = require('fs');
const { ethers } = require('ethers');
const crypto = require('@dm3-org/dm3-lib-crypto');
const messaging = require('@dm3-org/dm3-lib-messaging');
const deliveryApi = require('@dm3-org/dm3-lib-delivery-api');
// 1.7.1's index leaves out its messaging-http module (fetch, acknowledge): load its file
const messagingHttp = require(
    require('path').join(require('path').dirname(require.resolve('@dm3-org/dm3-lib-delivery-api')), 'messaging-http.js'),
);
const shared = require('@dm3-org/dm3-lib-shared');

const [command, configPath] = process.argv.slice(2);
const config = JSON.parse(fs.readFileSync(configPath, 'utf8'));

function say(event) {
    console.log(JSON.stringify(event));
}

function expect(ok, what, detail) {
    say({ check: what, ok, ...(detail === undefined ? {} : { detail }) });
    if (!ok) process.exit(1);
}

// ENS as the config says: service name -> its delivery service profile
const provider = {
    getResolver: async (name) => {
        const profile = config.services[name];
        if (!profile) return null;
        return {
            getText: async () => 'data:application/json,' + JSON.stringify(profile),
        };
    },
};

function account(user, serviceNames) {
    return {
        ensName: user.name,
        profile: {
            publicSigningKey: user.keys.signingKeyPair.publicKey,
            publicEncryptionKey: user.keys.encryptionKeyPair.publicKey,
            deliveryServices: serviceNames,
        },
    };
}

async function signIn(user, serviceNames) {
    const who = account(user, serviceNames);
    const challenge = await deliveryApi.getChallenge(who, provider);
    const signature = await crypto.sign(user.keys.signingKeyPair.privateKey, challenge);
    return deliveryApi.getNewToken(who, provider, signature);
}

async function rpc(url, body) {
    const response = await fetch(url + '/rpc', {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: typeof body === 'string' ? body : JSON.stringify(body),
    });
    return { status: response.status, body: await response.json() };
}

async function envelopeFor(from, to, text, serviceProfile) {
    const message = await messaging.createMessage(
        to.name, from.name, text, from.keys.signingKeyPair.privateKey,
    );
    const built = await messaging.buildEnvelop(message, crypto.encryptAsymmetric, {
        from: { ensName: from.name },
        to: account(to, []),
        deliverServiceProfile: serviceProfile,
        keys: from.keys,
    });
    return { message, envelope: built.encryptedEnvelop };
}

async function expectRefused(url, what, body, code, schemaValid) {
    const got = await rpc(url, body);
    const error = got.body.error || {};
    expect(error.code === code, what, { expected: code, got: error.code, message: error.message });
    if (schemaValid !== undefined) {
        // dm3's own schema check of the same envelope agrees with the node's verdict
        const envelope = JSON.parse(body.params[0]);
        const dm3Says = shared.validateSchema(messaging.schema.EncryptionEnvelopeSchema, envelope);
        expect(dm3Says === schemaValid, what + ': dm3 validateSchema agrees', { dm3Says });
    }
}

async function submit() {
    const { alice, bob, nodeA } = config;
    const serviceA = config.services['node-a.ds'];
    const bobAccount = account(bob, ['node-a.ds']);

    const properties = await deliveryApi.getDeliveryServiceProperties(provider, bobAccount);
    expect(properties.sizeLimit > 0, 'dm3_getDeliveryServiceProperties', properties);

    const token = await signIn(alice, ['node-a.ds']);
    expect(typeof token === 'string' && token.length > 20, 'alice signs in at node A (auth-http)');

    const { message, envelope } = await envelopeFor(alice, bob, config.text, serviceA);
    const call = messaging.createJsonRpcCallSubmitMessage(envelope, token);
    const size = messaging.getEnvelopSize(envelope);
    const accepted = await rpc(nodeA, { ...call, id: 1 });
    expect(accepted.body.result !== undefined, 'dm3_submitMessage to node A', accepted.body);
    say({ submitted: config.text, size, timestamp: message.metadata.timestamp });

    const ext = await rpc(nodeA, { jsonrpc: '2.0', id: 2, method: 'dm3_getProfileExtension', params: [bob.name] });
    expect(ext.body.result?.supportedMessageTypes?.includes('NEW'), 'dm3_getProfileExtension', ext.body);

    await hostile(nodeA, token, envelope, properties.sizeLimit);
}

async function hostile(url, token, good, sizeLimit) {
    const { alice, bob, mallory } = config;
    const serviceA = config.services['node-a.ds'];
    const call = (envelope, tok = token) => ({
        jsonrpc: '2.0', id: 7, method: 'dm3_submitMessage', params: [JSON.stringify(envelope), tok],
    });
    await expectRefused(url, 'not JSON', '{"jsonrpc": "2.0", "method": ', -32700);
    await expectRefused(url, 'not a request object', '[1, 2]', -32600);
    await expectRefused(url, 'JSON-RPC 1.0', { jsonrpc: '1.0', id: 1, method: 'dm3_submitMessage', params: [] }, -32006);
    await expectRefused(url, 'unknown method', { jsonrpc: '2.0', id: 1, method: 'dm3_nope', params: [] }, -32601);
    await expectRefused(url, 'params not [envelope, token]', { jsonrpc: '2.0', id: 1, method: 'dm3_submitMessage', params: [1] }, -32602);
    await expectRefused(url, 'extra envelope field', call({ ...good, extra: 'x' }), -32602, false);
    const { signature, ...unsigned } = good.metadata;
    await expectRefused(url, 'metadata without signature', call({ ...good, metadata: unsigned }), -32602, false);
    await expectRefused(url, 'no token', call(good, 'not-a-token'), -32003, true);
    const swapped = (await envelopeFor(alice, bob, 'swapped in', serviceA)).envelope;
    await expectRefused(url, 'message swapped under a signed metadata', call({ ...good, message: swapped.message }), -32003, true);
    const forgedSignature = await crypto.sign(mallory.keys.signingKeyPair.privateKey, shared.stringify(unsigned));
    const forged = { ...good, metadata: { ...good.metadata, signature: forgedSignature } };
    await expectRefused(url, "alice's envelope signed by mallory", call(forged), -32003, true);
    const malloryOwn = (await envelopeFor(mallory, bob, 'from mallory', serviceA)).envelope;
    await expectRefused(url, "another sender's token", call(malloryOwn), -32003, true);
    const elsewhere = (await envelopeFor(alice, bob, 'sealed for node B', config.services['node-b.ds'])).envelope;
    await expectRefused(url, 'delivery information sealed for another service', call(elsewhere), -32000, true);
    const stranger = { ...bob, name: config.strangerName };
    const lost = (await envelopeFor(alice, stranger, 'to nobody', serviceA)).envelope;
    await expectRefused(url, 'recipient unknown', call(lost), -32001, true);
    const big = (await envelopeFor(alice, bob, 'x'.repeat(sizeLimit), serviceA)).envelope;
    expect(messaging.getEnvelopSize(big) > sizeLimit, 'the big envelope is over the limit by dm3 getEnvelopSize');
    await expectRefused(url, 'over the size limit', call(big), -32011, true);
}

async function fetchAndAcknowledge() {
    const { alice, bob } = config;
    const services = ['node-a.ds', 'node-b.ds']; // node A is down: the client falls back to B
    const bobAccount = account(bob, services);
    const token = await signIn(bob, services);
    expect(typeof token === 'string', 'bob signs in (node A down: the delivery-api falls back to node B)');

    const envelopes = await messagingHttp.getNewMessages(bobAccount, token, alice.name, provider);
    expect(envelopes.length === 1, 'getNewMessages from alice', { count: envelopes.length });
    const opened = await messaging.decryptEnvelop(envelopes[0], bob.keys.encryptionKeyPair);
    expect(opened.message.message === config.text, 'decryptEnvelop gives the text', opened.message.message);
    expect(
        await messaging.checkMessageSignature(opened.message, alice.keys.signingKeyPair.publicKey, alice.name),
        "checkMessageSignature: alice's",
    );
    const postmark = opened.postmark;
    const { signature, ...unsigned } = postmark;
    expect(postmark.messageHash === ethers.utils.hashMessage(shared.stringify(envelopes[0].message)), 'postmark messageHash');
    const signerKey = config.services['node-a.ds'].publicSigningKey;
    expect(await crypto.checkSignature(signerKey, shared.sha256(shared.stringify(unsigned)), signature), "postmark signed by node A's service key");
    say({ fetched: opened.message.message, from: opened.message.metadata.from, postmarked: postmark.incommingTimestamp });

    const acks = [{ contactAddress: alice.name, messageHash: postmark.messageHash }];
    await messagingHttp.syncAcknowledgment(provider, bobAccount, acks, token, Date.now());
    const after = await messagingHttp.getNewMessages(bobAccount, token, alice.name, provider);
    expect(after.length === 0, 'acknowledged: nothing waits any more', { count: after.length });
}

async function openContainers() {
    // the storage containers chatsync export writes open with dm3-lib-crypto's decrypt
    const opened = [];
    for (const file of fs.readdirSync(config.dir).filter((f) => f.endsWith('.json')).sort()) {
        const sealed = JSON.parse(fs.readFileSync(config.dir + '/' + file, 'utf8'));
        const plain = JSON.parse(await crypto.decrypt(config.storageKey, sealed));
        opened.push({ file, keys: Object.keys(plain).sort() });
    }
    expect(opened.length > 0, 'every container opens with dm3-lib-crypto decrypt', opened);
}

const commands = { submit, fetch: fetchAndAcknowledge, open: openContainers };
commands[command]().catch((error) => {
    say({ error: String(error && error.stack ? error.stack : error) });
    process.exit(1);
});
