/**
 * The client walk-through: create a thread, subscribe and send a message, stream the run live to its
 * end, disconnect, let a second run happen unseen, resume from the last cursor and check the replay is
 * exactly the missed events, answer an approval the agent asks for, then walk the graph: a run's
 * activities with their run, a fork of the first run (its transfer's `source`), and the fork's run with
 * its thread, attempts and handoff. Exits 0 only if every step worked.
 *
 * Environment: THREADLOOM_URL (the server's base URL, default http://127.0.0.1:8000; /graphql is appended),
 * THREADLOOM_TOKEN, and
 * THREADLOOM_PROJECT_ID (else a project is created in a fresh temporary folder; that needs an
 * all-projects admin token).
 */
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { TERMINAL, ThreadloomClient, ThreadloomError, runStatus, type Run, type ThreadEvent } from "./threadloom.js";

const URL = (process.env["THREADLOOM_URL"] ?? "http://127.0.0.1:8000").replace(/\/+$/, "") + "/graphql";

function step(text: string): void {
  console.log(`[${new Date().toTimeString().slice(0, 8)}] ${text}`);
}

function check(condition: boolean, what: string): asserts condition {
  if (!condition) throw new Error(what);
}

/** The replay after `last` is every event from last+1 on, in order, none twice, none left out. */
function exactlyMissed(replay: ThreadEvent[], last: number, latest: number): void {
  const sequences = replay.map((e) => e.sequence);
  check(
    sequences.every((s, i) => s === last + 1 + i),
    `gap or repeat in ${JSON.stringify(sequences)}`,
  );
  const end = sequences.at(-1);
  check(end !== undefined && end >= latest, `replay ${JSON.stringify(sequences)} stops before ${latest}`);
}

async function walkThrough(client: ThreadloomClient, projectId: string): Promise<void> {
  // 1. A thread.
  const thread = await client.createThread(projectId, "typescript example");
  step(`thread ${thread.id}`);

  // 2. Subscribe first, then send: the run streams live over the WebSocket to its end.
  let last = 0;
  let run: Run | null = null;
  for await (const event of client.threadEvents(thread.id, 0)) {
    if (event.type === "synchronized") {
      if (run === null) {
        run = await client.sendMessage(thread.id, "@reply Hello from TypeScript");
        step(`run ${run.id} started; streaming it over a WebSocket`);
      }
      continue;
    }
    last = event.sequence;
    const entity = event.entity;
    if (entity?.__typename === "ConversationMessage" && !entity.streaming) {
      step(`  ${entity.role}: ${entity.text}`);
    }
    const status = run === null ? null : runStatus(event, run.id);
    if (status !== null && TERMINAL.has(status)) {
      check(status === "COMPLETED", `run ended ${status}`);
      break; // unsubscribes
    }
  }
  check(run !== null, "the subscription ended before `synchronized`");
  const firstRun: Run = run;

  // 3. Disconnect; a run happens while we are away.
  await client.disconnect();
  step(`disconnected at sequence ${last}`);
  const missed = await client.sendMessage(thread.id, "@reply Sent while you were away");
  while (!TERMINAL.has((await client.run(missed.id)).status)) {
    await sleep(100); // polling: we are not listening on purpose
  }
  const latest = (await client.thread(thread.id)).latestSequence;

  // 4. Resume from the last cursor: exactly the missed events, then `synchronized`, then live.
  // 5. Then the agent asks for approval; answer it and follow the run to its end.
  const replay: ThreadEvent[] = [];
  let approvalRun: Run | null = null;
  let completed = false;
  for await (const event of client.threadEvents(thread.id, last)) {
    if (event.type === "synchronized" && approvalRun === null) {
      exactlyMissed(replay, last, latest);
      step(`resumed after ${last}: ${replay.length} missed events, then live`);
      approvalRun = await client.sendMessage(thread.id, "@approval echo approved\n@reply Approved and done");
      continue;
    }
    if (approvalRun === null) {
      replay.push(event);
      continue;
    }
    const entity = event.entity;
    if (entity?.__typename === "RuntimeRequest" && entity.requestStatus === "PENDING") {
      const request = (await client.pendingRequests(thread.id)).find((r) => r.id === entity.id);
      check(request !== undefined, `request ${entity.id} is not pending`);
      step(`approval asked for \`${request.command ?? request.kind}\`; accepting`);
      check((await client.respondToApproval(request.id, "ACCEPT")) === "RESOLVED", "approval not resolved");
    }
    const status = runStatus(event, approvalRun.id);
    if (status !== null && TERMINAL.has(status)) {
      check(status === "COMPLETED", `approval run ended ${status}`);
      completed = true;
      break;
    }
  }
  await client.disconnect();
  check(completed, "the subscription ended before the approval run did");
  step("approval run completed");
  check(approvalRun !== null, "no approval run");
  await walkTheGraph(client, thread.id, firstRun, approvalRun);
}

/**
 * 6. The graph in single documents (docs/graph.md): an activity names its run, a fork's transfer names
 * the run it starts from (`source`, a TransferPoint union), and a run names its thread and the handoff
 * it received (`contextHandoff`) — no id copied into a second query.
 */
async function walkTheGraph(client: ThreadloomClient, threadId: string, first: Run, approvalRun: Run): Promise<void> {
  const activities = await client.activities(threadId, approvalRun.id);
  const asked = activities.find((a) => a.activityKind === "APPROVAL_REQUESTED");
  check(asked !== undefined, `no APPROVAL_REQUESTED activity in ${JSON.stringify(activities)}`);
  check(
    activities.every((a) => a.run?.id === approvalRun.id),
    "an activity of the approval run names another run",
  );
  step(`activity "${asked.summary}" belongs to run ${asked.run?.ordinal ?? "?"} (${asked.run?.status ?? "?"})`);

  const fork = await client.forkThread(first.id, "typescript fork");
  const source = fork.transfer.source;
  check(
    source?.__typename === "RunPoint" && source.run.id === first.id,
    `the fork starts at ${JSON.stringify(source)}, not at run ${first.id}`,
  );
  step(`forked thread ${fork.threadId} at run ${source.run.ordinal} (a ${fork.transfer.type} transfer)`);

  const onFork = await client.sendMessage(fork.threadId, "@reply Hello from the fork");
  while (!TERMINAL.has((await client.run(onFork.id)).status)) {
    await sleep(100);
  }
  const graph = await client.runGraph(onFork.id);
  check(graph.status === "COMPLETED", `the fork's run ended ${graph.status}`);
  check(graph.thread.id === fork.threadId, "the fork's run names another thread");
  const attempt = graph.attempts[0];
  check(attempt !== undefined && attempt.reason === "INITIAL", `attempts ${JSON.stringify(graph.attempts)}`);
  const handoff = graph.contextHandoff;
  if (handoff === null) {
    step(`the fork's run took no handoff: its provider thread (${attempt.providerThread?.id ?? "none"}) was forked natively`);
  } else {
    check(handoff.targetRun?.id === onFork.id, "the handoff names another run");
    const covered: number[] = handoff.coveredRunOrdinals;
    step(`the fork's run received a ${handoff.strategy} handoff covering runs ${covered.join(", ")}`);
  }
}

/** An error and its causes (fetch's `TypeError: fetch failed` hides ECONNREFUSED in `cause`). */
function describe(error: unknown): string {
  if (!(error instanceof Error)) return String(error);
  const code = error instanceof ThreadloomError && error.code ? ` [${error.code}]` : "";
  const text = `${error.name}${code}: ${error.message}`;
  return error.cause === undefined ? text : `${text} (${describe(error.cause)})`;
}

async function main(): Promise<number> {
  const token = process.env["THREADLOOM_TOKEN"];
  if (!token) {
    console.error("set THREADLOOM_TOKEN (the token `threadloom serve` printed)");
    return 2;
  }
  const client = new ThreadloomClient(URL, token);
  let made: { projectId: string; folder: string } | null = null; // what this example made: both go at the end
  try {
    let projectId = process.env["THREADLOOM_PROJECT_ID"];
    if (!projectId) {
      const folder = mkdtempSync(join(tmpdir(), "threadloom-ts-"));
      projectId = await client.createProject("typescript example", folder);
      made = { projectId, folder };
      step(`created project ${projectId}`);
    }
    await walkThrough(client, projectId);
    if (made) await cleanUp(client, made.projectId, made.folder);
  } catch (error) {
    console.error(`FAILED: ${describe(error)}`);
    await client.disconnect();
    if (made) await cleanUp(client, made.projectId, made.folder).catch(() => undefined);
    return 1;
  }
  step("every step worked");
  return 0;
}

/** Archive the project this example made (it leaves `projects`, refuses runs), then remove its folder. */
async function cleanUp(client: ThreadloomClient, projectId: string, folder: string): Promise<void> {
  await client.archiveProject(projectId);
  rmSync(folder, { recursive: true, force: true });
  step(`archived project ${projectId} and removed ${folder}`);
}

process.exitCode = await main();
