// The official ACP TypeScript SDK acting as the editor in front of
// `zcode-acp -- zcode-acp shell-agent`. Exits non-zero on any failure.
//
// usage: node editor.mjs ZCODE_ACP_BINARY WORKSPACE
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { Readable, Writable } from "node:stream";
import { client, methods, ndJsonStream } from "@agentclientprotocol/sdk";

const [bin, workspace] = process.argv.slice(2);
const bridge = spawn(bin, ["--", bin, "shell-agent"], { stdio: ["pipe", "pipe", "inherit"] });
const stream = ndJsonStream(Writable.toWeb(bridge.stdin), Readable.toWeb(bridge.stdout));

const chunks = new Map();
const writes = [];
const app = client({ name: "zcode-acp-sdk-test" })
  .onNotification(methods.client.session.update, ({ params }) => {
    const u = params.update;
    if (u.sessionUpdate === "agent_message_chunk" && u.content.type === "text") {
      chunks.set(params.sessionId, (chunks.get(params.sessionId) ?? "") + u.content.text);
    }
  })
  .onRequest(methods.client.fs.writeTextFile, ({ params }) => {
    writes.push(params.path);
    writeFileSync(params.path, params.content);
    return {};
  });

function check(cond, what) {
  if (!cond) throw new Error(`check failed: ${what}`);
}

async function prompt(ctx, sessionId, text) {
  chunks.set(sessionId, "");
  const r = await ctx.request(methods.agent.session.prompt, { sessionId, prompt: [{ type: "text", text }] });
  return { stopReason: r.stopReason, text: chunks.get(sessionId) };
}

await app.connectWith(stream, async (ctx) => {
  const init = await ctx.request(methods.agent.initialize, {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: false, writeTextFile: true } },
  });
  check(init.protocolVersion === 1, "protocol version 1");
  check(init.agentCapabilities.loadSession === true, "the shell agent can load sessions");

  const { sessionId } = await ctx.request(methods.agent.session.new, { cwd: workspace, mcpServers: [] });
  let r = await prompt(ctx, sessionId, "echo sdk-ok > out.txt; cat out.txt");
  check(r.stopReason === "end_turn" && r.text === "sdk-ok\n", `shell prompt: ${JSON.stringify(r)}`);

  // A restart under the SDK's feet: the same session keeps working.
  process.kill(bridge.pid, "SIGHUP");
  r = await prompt(ctx, sessionId, "cat out.txt");
  check(r.text === "sdk-ok\n", `after restart: ${JSON.stringify(r)}`);

  // The agent asks the editor to write through ACP.
  r = await prompt(ctx, sessionId, "/write via-editor.txt written through the SDK");
  check(writes.length === 1, "one fs/write_text_file reached the SDK");
  check(readFileSync(join(workspace, "via-editor.txt"), "utf8") === "written through the SDK", "file content");

  await ctx.request(methods.agent.session.setMode, { sessionId, modeId: "dry-run" });
  r = await prompt(ctx, sessionId, "rm -rf /");
  check(r.text === "dry-run: would run `rm -rf /`", `dry-run: ${JSON.stringify(r)}`);
});

bridge.stdin.end();
const code = await new Promise((resolve) => bridge.on("exit", (c) => resolve(c)));
check(code === 0, `bridge exit code ${code}`);
console.log("sdk editor: all checks passed");
