// The official ACP TypeScript SDK as the editor in front of zcode-acp and a
// real agent (tests/real_agents.rs). Runs one prompt; allows the agent's own
// permission requests once and answers the bridge's prompts "Allow once";
// prints a JSON summary as its last line. Exits non-zero on any failure.
//
// usage: node real_agent.mjs WORKSPACE PROMPT ZCODE_ACP -- AGENT ARGS...
import { spawn } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { Readable, Writable } from "node:stream";
import { client, methods, ndJsonStream } from "@agentclientprotocol/sdk";

const [workspace, promptText, bin, ...rest] = process.argv.slice(2);
const bridge = spawn(bin, rest, { stdio: ["pipe", "pipe", "inherit"] });
const stream = ndJsonStream(Writable.toWeb(bridge.stdin), Readable.toWeb(bridge.stdout));

const bridgePrompts = [];
let text = "";
const app = client({ name: "zcode-acp-real-agent-test" })
  .onNotification(methods.client.session.update, ({ params }) => {
    const u = params.update;
    if (u.sessionUpdate === "agent_message_chunk" && u.content.type === "text") {
      text += u.content.text;
    }
  })
  .onRequest(methods.client.session.requestPermission, ({ params }) => {
    if (params.toolCall.toolCallId.startsWith("zcode-acp-")) {
      bridgePrompts.push(params.toolCall.title);
      return { outcome: { outcome: "selected", optionId: "allow-once" } };
    }
    const once = params.options.find((o) => o.kind === "allow_once");
    return { outcome: { outcome: "selected", optionId: once.optionId } };
  })
  .onRequest(methods.client.fs.writeTextFile, ({ params }) => {
    writeFileSync(params.path, params.content);
    return {};
  })
  .onRequest(methods.client.fs.readTextFile, ({ params }) => {
    return { content: readFileSync(params.path, "utf8") };
  });

let stopReason;
await app.connectWith(stream, async (ctx) => {
  await ctx.request(methods.agent.initialize, {
    protocolVersion: 1,
    clientCapabilities: { fs: { readTextFile: true, writeTextFile: true } },
  });
  const { sessionId } = await ctx.request(methods.agent.session.new, { cwd: workspace, mcpServers: [] });
  const r = await ctx.request(methods.agent.session.prompt, {
    sessionId,
    prompt: [{ type: "text", text: promptText }],
  });
  stopReason = r.stopReason;
});

bridge.stdin.end();
const code = await new Promise((resolve) => bridge.on("exit", (c) => resolve(c)));
if (code !== 0) throw new Error(`bridge exit code ${code}`);
console.log(JSON.stringify({ stopReason, bridgePrompts, text }));
