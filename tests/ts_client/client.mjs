#!/usr/bin/env node
// An MCP client we did not write: the official TypeScript SDK, driven against mcp-knecht.
//
//   node client.mjs stdio [options] -- COMMAND [ARGS...]   spawn the server, talk over stdio
//   node client.mjs http --url URL [options]               Streamable HTTP; bearer token from
//                                                          $MCP_BEARER_TOKEN (kept out of argv)
// options:
//   --call NAME            call this tool ...
//   --args JSON            ... with these arguments (default {})
//   --invalid-call NAME    call this tool with arguments the server must refuse ...
//   --invalid-args JSON    ... namely these
//   --expect-unauthorized  (http) succeed only if the server answers 401 to the first request
//
// Prints one JSON document on stdout. Exit codes: 0 ok; 1 connection or protocol failure
// (the JSON then has "ok": false and an "error"); 2 usage; 3 --expect-unauthorized but the
// connection succeeded.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport, StreamableHTTPError } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { UnauthorizedError } from '@modelcontextprotocol/sdk/client/auth.js';

const TIMEOUT_MS = 20_000;

function usage(message) {
    process.stderr.write(`client.mjs: ${message}\n`);
    process.exit(2);
}

function parseArgs(argv) {
    const [mode, ...rest] = argv;
    if (mode !== 'stdio' && mode !== 'http') usage('first argument must be "stdio" or "http"');
    const opts = { mode, args: {}, invalidArgs: {}, command: [] };
    for (let i = 0; i < rest.length; i++) {
        const arg = rest[i];
        const value = () => {
            if (i + 1 >= rest.length) usage(`${arg} needs a value`);
            return rest[++i];
        };
        const json = () => {
            const text = value();
            try {
                return JSON.parse(text);
            } catch (err) {
                usage(`${arg}: not JSON: ${text}`);
            }
        };
        switch (arg) {
            case '--':
                opts.command = rest.slice(i + 1);
                i = rest.length;
                break;
            case '--url': opts.url = value(); break;
            case '--call': opts.call = value(); break;
            case '--args': opts.args = json(); break;
            case '--invalid-call': opts.invalidCall = value(); break;
            case '--invalid-args': opts.invalidArgs = json(); break;
            case '--expect-unauthorized': opts.expectUnauthorized = true; break;
            default: usage(`unknown argument ${arg}`);
        }
    }
    if (mode === 'stdio' && opts.command.length === 0) usage('stdio needs -- COMMAND [ARGS...]');
    if (mode === 'http' && !opts.url) usage('http needs --url URL');
    return opts;
}

function makeTransport(opts) {
    if (opts.mode === 'stdio') {
        const [command, ...args] = opts.command;
        // The server gets our whole environment (KNECHT_TOKEN, database, secret ...), not the
        // SDK's small default set; its stderr goes to ours so failures are visible.
        return new StdioClientTransport({ command, args, env: { ...process.env }, stderr: 'inherit' });
    }
    const headers = {};
    const token = process.env.MCP_BEARER_TOKEN;
    if (token) headers.Authorization = `Bearer ${token}`;
    return new StreamableHTTPClientTransport(new URL(opts.url), { requestInit: { headers } });
}

function summarise(result) {
    return {
        isError: result.isError === true,
        text: (result.content ?? []).filter(c => c.type === 'text').map(c => c.text).join('\n'),
        contentTypes: (result.content ?? []).map(c => c.type),
        structuredContent: result.structuredContent ?? null,
    };
}

function describeError(err) {
    let status = null;
    if (err instanceof StreamableHTTPError && typeof err.code === 'number' && err.code > 0) status = err.code;
    else if (err instanceof UnauthorizedError) status = 401;
    const match = /\b(\d{3})\b/.exec(String(err?.message ?? ''));
    if (status === null && err instanceof StreamableHTTPError && match) status = Number(match[1]);
    return { name: err?.constructor?.name ?? 'Error', message: String(err?.message ?? err), status };
}

async function main() {
    const opts = parseArgs(process.argv.slice(2));
    const client = new Client({ name: 'knecht-ts-e2e', version: '0.0.1' });
    const transport = makeTransport(opts);
    const out = { ok: false, transport: opts.mode };
    const requestOptions = { timeout: TIMEOUT_MS };

    try {
        await client.connect(transport, requestOptions);
    } catch (err) {
        out.error = describeError(err);
        if (opts.expectUnauthorized && out.error.status === 401) {
            out.ok = true;
            out.unauthorized = true;
            process.stdout.write(JSON.stringify(out) + '\n');
            await client.close().catch(() => {});
            return 0;
        }
        process.stdout.write(JSON.stringify(out) + '\n');
        await client.close().catch(() => {});
        return 1;
    }

    try {
        if (opts.expectUnauthorized) {
            out.error = { name: 'Connected', message: 'connected although a 401 was expected', status: null };
            process.stdout.write(JSON.stringify(out) + '\n');
            return 3;
        }
        out.server = client.getServerVersion() ?? null;
        out.protocolVersion = transport.protocolVersion ?? null;
        out.instructions = client.getInstructions() ?? null;
        const { tools } = await client.listTools(undefined, requestOptions);
        out.tools = tools.map(t => t.name).sort();
        out.toolDetails = Object.fromEntries(tools.map(t => [t.name, {
            readOnlyHint: t.annotations?.readOnlyHint ?? null,
            destructiveHint: t.annotations?.destructiveHint ?? null,
            hasOutputSchema: Boolean(t.outputSchema),
            inputSchemaType: t.inputSchema?.type ?? null,
        }]));
        if (opts.call) {
            // callTool validates structuredContent against the tool's outputSchema (from listTools).
            out.call = summarise(await client.callTool({ name: opts.call, arguments: opts.args }, undefined, requestOptions));
        }
        if (opts.invalidCall) {
            try {
                out.invalid = summarise(await client.callTool(
                    { name: opts.invalidCall, arguments: opts.invalidArgs }, undefined, requestOptions));
            } catch (err) {
                // A JSON-RPC error instead of an isError result: report it, the test decides.
                out.invalid = { protocolError: { code: err?.code ?? null, message: String(err?.message ?? err) } };
            }
        }
        out.ok = true;
        process.stdout.write(JSON.stringify(out) + '\n');
        return 0;
    } catch (err) {
        out.error = describeError(err);
        process.stdout.write(JSON.stringify(out) + '\n');
        return 1;
    } finally {
        await client.close().catch(() => {});
    }
}

main().then(
    code => { process.exitCode = code; },
    err => {
        process.stdout.write(JSON.stringify({ ok: false, error: describeError(err) }) + '\n');
        process.exitCode = 1;
    },
);
