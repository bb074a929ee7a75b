// Threadloom's live dashboard: plain JavaScript, no build step, nothing from a CDN.
//
// Queries and mutations are POSTs to /graphql; live data comes over one WebSocket speaking
// graphql-transport-ws. After a disconnect (a server restart, a network blip) the socket reconnects with
// backoff and every subscription is sent again from the last position it saw: `threadEvents` with
// `afterSequence` = the last sequence applied, `projectThreads` with `after` = the last cursor. Events at or
// below the last sequence are dropped, so a replay never shows anything twice.
//
// Every string from the server reaches the page as a text node (textContent), never as markup.
"use strict";

const TOKEN_KEY = "threadloom.token";
// This tab's device name for the writer lease (docs/leases.md): sent as `Threadloom-Device` and as `deviceId` in
// connection_init, kept for the tab's life so a reload is still the same device.
const DEVICE_KEY = "threadloom.device";
const DEVICE = sessionStorage.getItem(DEVICE_KEY) || `dashboard-${Math.random().toString(36).slice(2, 10)}`;
sessionStorage.setItem(DEVICE_KEY, DEVICE);
const LEASE_TTL = 60; // seconds; renewed every LEASE_TTL / 3 while this tab drives the open thread
const GRAPHQL = new URL("/graphql", location.href);
const SOCKET_URL = GRAPHQL.href.replace(/^http/, "ws");

// ---- GraphQL documents -------------------------------------------------------------------------------
// Fields of the same name but another type on different entities are aliased (GraphQL merges them).
const FRAGMENTS = `
fragment T on RunAttempt { id attemptOrdinal attemptStatus: status reason }
fragment U on Usage { calls costUsd costSource inputTokens outputTokens }
fragment R on Run { id ordinal status statusReason queuePosition userMessage { id text } attempts { ...T }
  requestedAt startedAt completedAt runUsage: usage { ...U } }
fragment N on ExecutionNode { id nodeKind: kind nodeStatus: status nodeTitle: title nodeRun: run { id } parent { id } attempt { id }
  createdAt completedAt detail }
fragment P on PlanArtifact { id planKind: kind planStatus: status items planText: text updatedAt node { id } }
fragment M on ConversationMessage { id role text streaming createdAt }
fragment Q on RuntimeRequest { id requestKind: kind requestStatus: status payload responseCapability reqRun: run { id } }
fragment A on Activity { id activityKind: kind summary sequence runId nodeId createdAt }
fragment C on Checkpoint { id ordinal checkpointStatus: status checkpointRun: run { id ordinal }
  checkpointScope: scope { kind node { id nodeTitle: title } } }
fragment TH on Thread { id threadTitle: title threadStatus: status queueHeld queueHoldReason activeRun { id }
  lease { deviceId tokenName expiresAt } }`;
const SUMMARY_FRAGMENT = `
fragment S on Thread {
  ...TH latestSequence todoList { ...P } queue { ...R } pendingRequests { ...Q } checkpoints(last: 30) { nodes { ...C } }
  lineage { relationship parentThread { id title } forks(first: 30) { nodes { id title status } } }
  threadUsage: usage { ...U }
  budgets { id window action maxCostUsd maxTokens exceeded budgetSpent: spent { ...U } }
}`;

const VIEWER = `query { viewer { scope project { id name } } }`;
const PROJECTS = `query { projects(first: 100) { nodes { id name } } }`;
const PROJECT_THREADS = `query($p: ID!) { project(id: $p) { id feedCursor threads(first: 100) { nodes { id title status } } } }`;
const PROJECT_FEED = `subscription($p: ID!, $after: String) {
  projectThreads(projectId: $p, after: $after) { cursor sequence type thread { id title status } } }`;
const THREAD = `query($t: ID!) { thread(id: $t) { ...S
  runs(last: 20) { nodes { ...R executionGraph { nodes { ...N } } } }
  messages(last: 100) { nodes { ...M } }
  activities(last: 100) { nodes { ...A } } } }` + FRAGMENTS + SUMMARY_FRAGMENT;
const SUMMARY = `query($t: ID!) { thread(id: $t) { ...S } }` + FRAGMENTS.replace(/fragment [AM] on .*\n/g, "")
  .replace(/fragment N on [^\n]*\n[^\n]*\n/, "") + SUMMARY_FRAGMENT;
const EVENTS = `subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type runId nodeId
  entity { __typename ...TH ...R ...T ...N ...M ...Q ...A ...C ...P ...UR } } }` + FRAGMENTS + `
fragment UR on UsageRecord { id usageRun: run { id runUsage: usage { ...U } } }`;

const ERRORS = "userErrors { code message }";
const MUTATIONS = {
  createThread: `mutation($p: ID!, $title: String) { createThread(input: {projectId: $p, title: $title}) { thread { id } ${ERRORS} } }`,
  sendMessage: `mutation($t: ID!, $text: String!, $d: DispatchInput) {
    sendMessage(input: {threadId: $t, text: $text, dispatch: $d}) { run { id status } ${ERRORS} } }`,
  stopThread: `mutation($t: ID!) { stopThread(input: {threadId: $t}) { thread { id } ${ERRORS} } }`,
  resumeQueue: `mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { thread { id } ${ERRORS} } }`,
  respondToApproval: `mutation($r: ID!, $d: Decision!) {
    respondToApproval(input: {requestId: $r, decision: $d}) { request { id status } ${ERRORS} } }`,
  respondToUserInput: `mutation($r: ID!, $a: [QuestionAnswer!]!) {
    respondToUserInput(input: {requestId: $r, answers: $a}) { request { id status } ${ERRORS} } }`,
  reorderQueuedRun: `mutation($r: ID!, $pos: Int!) { reorderQueuedRun(input: {runId: $r, position: $pos}) { run { id } ${ERRORS} } }`,
  cancelQueuedRun: `mutation($r: ID!) { cancelQueuedRun(input: {runId: $r}) { run { id } ${ERRORS} } }`,
  rollbackToRun: `mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) { thread { id } ${ERRORS} } }`,
  rollbackNode: `mutation($n: ID!, $c: ID!) { rollbackNode(input: {nodeId: $n, checkpointId: $c}) { node { id } ${ERRORS} } }`,
  undoRollback: `mutation($t: ID!) { undoRollback(input: {threadId: $t}) { thread { id } ${ERRORS} } }`,
  forkThread: `mutation($r: ID!) { forkThread(input: {source: {run: $r}}) { thread { id } ${ERRORS} } }`,
  acquireThreadLease: `mutation($t: ID!, $ttl: Int!, $takeover: Boolean!) {
    acquireThreadLease(input: {threadId: $t, ttlSeconds: $ttl, takeover: $takeover}) {
      thread { id lease { deviceId tokenName expiresAt } } ${ERRORS} } }`,
  renewThreadLease: `mutation($t: ID!, $ttl: Int!) { renewThreadLease(input: {threadId: $t, ttlSeconds: $ttl}) {
    thread { id lease { deviceId tokenName expiresAt } } ${ERRORS} } }`,
  releaseThreadLease: `mutation($t: ID!) { releaseThreadLease(input: {threadId: $t}) { thread { id } ${ERRORS} } }`,
};

// ---- small DOM helper: text only ---------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "className") el.className = value;
    else el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}
const $ = (id) => document.getElementById(id);

// Puts `nodes` in `container` in place of its children, keeping each old child that is equal to the new one at
// its place. Every event renders the page again; replacing an unchanged button between a click's press and
// its release made the browser drop the click (the two landed on different elements), and replacing a form
// lost what was typed into it. Equal means the same markup, ids included (`data-*`), so a kept element's
// handlers act on the same run, request or checkpoint.
function patch(container, nodes) {
  const old = container.children;
  if (old.length === nodes.length && nodes.every((node, i) => old[i].isEqualNode(node))) return;
  container.replaceChildren(...nodes.map((node, i) => (old[i] && old[i].isEqualNode(node) ? old[i] : node)));
}
const statusBadge = (status) => h("span", { className: "status", "data-status": status }, status || "?");

// ---- times: a clock time to read, the full timestamp on hover, durations in words ---------------------
function clock(iso) {
  if (!iso) return null;
  const at = new Date(iso);
  return h("time", { datetime: iso, title: at.toLocaleString() }, at.toLocaleTimeString([], { hour12: false }));
}

function duration(fromIso, toIso) {
  if (!fromIso || !toIso) return "";
  const ms = Math.max(0, new Date(toIso) - new Date(fromIso));
  if (ms < 1000) return `${ms} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(1)} s`;
  const minutes = Math.floor(ms / 60_000);
  return `${minutes} min ${Math.round((ms % 60_000) / 1000)} s`;
}

// ---- HTTP --------------------------------------------------------------------------------------------
class AuthError extends Error {}

async function gql(query, variables) {
  const response = await fetch(GRAPHQL, {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${state.token}`, "threadloom-device": DEVICE },
    body: JSON.stringify({ query, variables: variables || {} }),
  });
  if (response.status === 401 || response.status === 403) throw new AuthError("the server refused this token");
  const body = await response.json();
  if (body.errors && body.errors.length) throw new Error(body.errors.map((e) => e.message).join("; "));
  return body.data;
}

async function mutate(name, variables) {
  showError("");
  try {
    const payload = (await gql(MUTATIONS[name], variables))[name];
    if (payload.userErrors && payload.userErrors.length) {
      showError(payload.userErrors.map((e) => `${e.code}: ${e.message}`).join("; "));
      return null;
    }
    return payload;
  } catch (error) {
    showError(`${name}: ${error.message}`);
    return null;
  }
}

function showError(text) {
  $("error").textContent = text;
}

// ---- graphql-transport-ws ----------------------------------------------------------------------------
// One socket; subscriptions survive reconnects: on every connection_ack each is sent again with the
// variables its `variables()` gives now (the newest cursor).
class Socket {
  constructor(url, token, onState, onRefused) {
    Object.assign(this, { url, token, onState, onRefused });
    this.subs = new Map();
    this.nextId = 1;
    this.failures = 0;
    this.ws = null;
    this.acked = false;
    this.stopped = false;
    this.timer = null;
  }

  start() {
    this.connect();
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000);
    this.ws = null;
  }

  connect() {
    this.onState(this.failures ? "reconnecting" : "connecting");
    const ws = new WebSocket(this.url, "graphql-transport-ws");
    this.ws = ws;
    this.acked = false;
    ws.onopen = () =>
      this.send({ type: "connection_init", payload: { authorization: `Bearer ${this.token}`, deviceId: DEVICE } });
    ws.onmessage = (event) => this.receive(JSON.parse(event.data));
    ws.onclose = (event) => {
      if (this.ws !== ws || this.stopped) return;
      this.ws = null;
      this.acked = false;
      if (event.code === 4403 || event.code === 4401) {
        this.onState("refused");
        this.onRefused();
        return;
      }
      const delay = Math.min(5000, 250 * 2 ** this.failures) + Math.floor(Math.random() * 250);
      this.failures += 1;
      this.onState("reconnecting", `reconnecting in ${(delay / 1000).toFixed(1)} s`);
      this.timer = setTimeout(() => this.connect(), delay);
    };
  }

  send(message) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(JSON.stringify(message));
  }

  receive(message) {
    const sub = this.subs.get(message.id);
    switch (message.type) {
      case "connection_ack":
        this.acked = true;
        this.failures = 0;
        this.onState("live");
        for (const s of this.subs.values()) this.sendSubscribe(s);
        break;
      case "ping":
        this.send({ type: "pong" });
        break;
      case "next":
        if (sub && !this.resumable(sub, message.payload.errors)) sub.next(message.payload);
        break;
      case "error":
        if (sub && !this.resumable(sub, message.payload)) {
          this.subs.delete(message.id);
          sub.error(message.payload);
        }
        break;
      case "complete":
        if (sub && sub.resume === "now") {
          sub.resume = null;
          this.sendSubscribe(sub); // from our cursor, on this socket
        } else if (sub && sub.resume === "elsewhere") {
          sub.resume = null; // stays in `subs`: sent again after the reconnect
        } else if (sub) {
          this.subs.delete(message.id);
          if (sub.complete) sub.complete();
        }
        break;
    }
  }

  // The server ends a subscription it wants resumed: SUBSCRIBER_TOO_SLOW (subscribe again now) or
  // SERVER_GOING_AWAY (reconnect, to this server after its restart or to another replica).
  resumable(sub, errors) {
    const codes = (errors || []).map((e) => e.extensions && e.extensions.code);
    if (codes.includes("SUBSCRIBER_TOO_SLOW")) sub.resume = "now";
    else if (codes.includes("SERVER_GOING_AWAY")) {
      sub.resume = "elsewhere";
      if (this.ws) this.ws.close(4000, "server going away");
    } else return false;
    return true;
  }

  sendSubscribe(sub) {
    sub.resume = null;
    this.send({ id: sub.id, type: "subscribe", payload: { query: sub.query, variables: sub.variables() } });
  }

  subscribe(query, variables, handlers) {
    const sub = { id: String(this.nextId++), query, variables, ...handlers };
    this.subs.set(sub.id, sub);
    if (this.acked) this.sendSubscribe(sub);
    return () => {
      if (this.subs.delete(sub.id) && this.acked) this.send({ id: sub.id, type: "complete" });
    };
  }
}

// ---- state -------------------------------------------------------------------------------------------
const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  socket: null,
  projects: [],
  projectId: null,
  threads: new Map(),
  feedCursor: null,
  stopFeed: null,
  threadId: null,
  stopEvents: null,
  t: null, // the selected thread's data
};

function emptyThread(id) {
  return {
    id, info: null, lastSeq: 0, synchronized: false,
    runs: new Map(), nodes: new Map(), messages: new Map(), requests: new Map(), activities: new Map(),
    checkpoints: new Map(), plans: new Map(), queue: [], lineage: null, usage: null, budgets: [],
  };
}

function setConnection(kind, text) {
  const el = $("connection");
  el.dataset.state = kind;
  el.textContent = text || kind;
}

// ---- sign in / out -----------------------------------------------------------------------------------
async function signIn(token) {
  state.token = token;
  try {
    const { viewer } = await gql(VIEWER);
    sessionStorage.setItem(TOKEN_KEY, token);
    $("viewer").textContent = viewer.project ? `${viewer.scope} · ${viewer.project.name}` : `${viewer.scope} · all projects`;
    state.projects = viewer.project ? [viewer.project] : (await gql(PROJECTS)).projects.nodes;
  } catch (error) {
    signOut(error instanceof AuthError ? "The server refused this token." : `Cannot reach the server: ${error.message}`);
    return;
  }
  $("login").hidden = true;
  $("app").hidden = false;
  $("signout").hidden = false;
  state.socket = new Socket(SOCKET_URL, token, setConnection, () => signOut("The server refused this token."));
  state.socket.start();
  const select = $("project");
  select.replaceChildren(...state.projects.map((p) => h("option", { value: p.id }, p.name)));
  const remembered = sessionStorage.getItem("threadloom.project");
  const first = state.projects.find((p) => p.id === remembered) || state.projects[0];
  if (first) {
    select.value = first.id;
    await selectProject(first.id);
  }
}

function signOut(message) {
  if (state.t) stopDriving(state.t);
  if (state.socket) state.socket.stop();
  Object.assign(state, { socket: null, token: null, projectId: null, threadId: null, t: null, stopFeed: null, stopEvents: null });
  state.threads.clear();
  sessionStorage.removeItem(TOKEN_KEY);
  $("app").hidden = true;
  $("signout").hidden = true;
  $("login").hidden = false;
  $("viewer").textContent = "";
  $("login-error").textContent = message || "";
  setConnection("offline");
}

// ---- project: its threads, live ----------------------------------------------------------------------
async function selectProject(projectId, pickThread = true) {
  if (state.stopFeed) state.stopFeed();
  state.projectId = projectId;
  sessionStorage.setItem("threadloom.project", projectId);
  await loadProjectThreads();
  state.stopFeed = state.socket.subscribe(PROJECT_FEED, () => ({ p: projectId, after: state.feedCursor }), {
    next: (payload) => {
      if (payload.errors) return showError(payload.errors.map((e) => e.message).join("; "));
      const item = payload.data.projectThreads;
      if (item.type === "reload_required") {
        selectProject(projectId, false); // the subscription ends: reload the list, follow from its cursor
        return;
      }
      state.feedCursor = item.cursor;
      if (item.thread) state.threads.set(item.thread.id, item.thread);
      renderThreads();
    },
    error: (errors) => showError(errors.map((e) => e.message).join("; ")),
  });
  if (!pickThread) return;
  const remembered = sessionStorage.getItem("threadloom.thread");
  if (remembered && state.threads.has(remembered)) selectThread(remembered);
  else if (state.threads.size && !state.threadId) selectThread([...state.threads.keys()].at(-1));
}

async function loadProjectThreads() {
  const { project } = await gql(PROJECT_THREADS, { p: state.projectId });
  state.threads.clear();
  if (!project) return;
  state.feedCursor = project.feedCursor;
  for (const thread of project.threads.nodes) state.threads.set(thread.id, thread);
  renderThreads();
}

function renderThreads() {
  patch($("threads"),
    [...state.threads.values()].map((t) =>
      h("li", { "data-id": t.id, "aria-current": t.id === state.threadId ? "true" : null, onclick: () => selectThread(t.id) },
        h("span", { className: "title" }, t.title), statusBadge(t.status))),
  );
}

// ---- thread: snapshot, then events after its sequence ------------------------------------------------
async function selectThread(threadId) {
  if (state.t && state.t.id !== threadId) stopDriving(state.t);
  if (state.stopEvents) state.stopEvents();
  state.stopEvents = null;
  state.threadId = threadId;
  sessionStorage.setItem("threadloom.thread", threadId);
  const t = emptyThread(threadId);
  state.t = t;
  $("thread").hidden = false;
  renderedRequests = null;
  messagesPinned = true;
  renderThreads();
  try {
    await loadThread(t);
  } catch (error) {
    showError(`Cannot load the thread: ${error.message}`);
    return;
  }
  if (state.t === t) followThread(t); // not when another thread was picked meanwhile
}

async function loadThread(t) {
  const { thread } = await gql(THREAD, { t: t.id });
  if (!thread || state.t !== t) return;
  t.lastSeq = thread.latestSequence;
  for (const run of thread.runs.nodes) {
    upsert(t, run.__typename ? run : { __typename: "Run", ...run });
    for (const node of run.executionGraph.nodes) upsert(t, { __typename: "ExecutionNode", ...node });
  }
  for (const message of thread.messages.nodes) upsert(t, { __typename: "ConversationMessage", ...message });
  for (const activity of thread.activities.nodes) upsert(t, { __typename: "Activity", ...activity });
  applySummary(t, thread);
  render();
}

function followThread(t) {
  state.stopEvents = state.socket.subscribe(EVENTS, () => ({ t: t.id, after: t.lastSeq }), {
    next: (payload) => {
      if (state.t !== t) return;
      if (payload.errors) return showError(payload.errors.map((e) => e.message).join("; "));
      const event = payload.data.threadEvents;
      if (event.type === "synchronized") {
        t.synchronized = true;
        refreshSummary(t);
        return;
      }
      if (event.type === "reload_required") {
        // Too much to replay: start again from a fresh snapshot.
        selectThread(t.id);
        return;
      }
      if (event.sequence <= t.lastSeq) return; // already applied: a replay overlapping what we have
      t.lastSeq = event.sequence;
      // seenAt: the summary read later must not undo this with an older snapshot (applySummary)
      if (event.entity) upsert(t, { ...event.entity, __typename: event.entity.__typename, seenAt: event.sequence });
      if (/^(thread|run|request|queue|checkpoint|rollback|transfer|usage|budget)\./.test(event.type)) refreshSummary(t);
      scheduleRender();
    },
    error: (errors) => showError(errors.map((e) => e.message).join("; ")),
  });
}

function upsert(t, entity) {
  const kind = entity.__typename;
  const merge = (map) => map.set(entity.id, { ...(map.get(entity.id) || {}), ...entity });
  if (kind === "Run") merge(t.runs);
  else if (kind === "ExecutionNode") merge(t.nodes);
  else if (kind === "ConversationMessage") merge(t.messages);
  else if (kind === "RuntimeRequest") merge(t.requests);
  else if (kind === "Activity") {
    merge(t.activities);
    if (t.activities.size > 500) t.activities.delete(t.activities.keys().next().value); // keep memory bounded
  }
  else if (kind === "Checkpoint") merge(t.checkpoints);
  else if (kind === "UsageRecord" && entity.usageRun) {
    const run = t.runs.get(entity.usageRun.id); // a model call: its run's cost grew
    if (run) run.runUsage = entity.usageRun.runUsage;
  }
  else if (kind === "PlanArtifact") merge(t.plans);
  else if (kind === "RunAttempt") {
    for (const run of t.runs.values()) {
      const i = (run.attempts || []).findIndex((a) => a.id === entity.id);
      if (i >= 0) run.attempts[i] = { ...run.attempts[i], ...entity };
    }
  } else if (kind === "Thread" && entity.id === t.id) {
    t.info = { ...(t.info || {}), ...entity };
    const listed = state.threads.get(t.id);
    if (listed && entity.threadStatus) listed.status = entity.threadStatus;
  }
}

// The queue order, pending requests, checkpoints and forks are read again after events that change them
// (debounced; one request in flight, another after it if something changed meanwhile).
function refreshSummary(t) {
  t.summaryWanted = true;
  if (t.summaryTimer || t.summaryBusy) return;
  t.summaryTimer = setTimeout(async () => {
    t.summaryTimer = null;
    t.summaryBusy = true;
    t.summaryWanted = false;
    try {
      const { thread } = await gql(SUMMARY, { t: t.id });
      if (thread && state.t === t) applySummary(t, thread);
      scheduleRender();
    } catch (error) {
      // the socket's reconnect brings a new summary
    } finally {
      t.summaryBusy = false;
      if (t.summaryWanted) refreshSummary(t);
    }
  }, 100);
}

// A summary is one snapshot at `latestSequence`. It may have been read before events the page already
// applied (its request was in flight meanwhile): an entity an event updated after that snapshot keeps what
// the event said, and the next summary (one is always wanted after such an event) brings it up to date.
function applySummary(t, thread) {
  const current = (map, id) => ((map.get(id) || {}).seenAt || 0) <= thread.latestSequence;
  t.info = { ...(t.info || {}), id: thread.id, threadTitle: thread.threadTitle, threadStatus: thread.threadStatus,
    queueHeld: thread.queueHeld, queueHoldReason: thread.queueHoldReason, activeRun: thread.activeRun,
    lease: thread.lease };
  t.queue = thread.queue.map((run) => run.id);
  if (thread.todoList && current(t.plans, thread.todoList.id)) upsert(t, { __typename: "PlanArtifact", ...thread.todoList });
  for (const run of thread.queue) if (current(t.runs, run.id)) upsert(t, { __typename: "Run", ...run });
  const pending = new Set(thread.pendingRequests.map((r) => r.id));
  for (const request of thread.pendingRequests) {
    if (current(t.requests, request.id)) upsert(t, { __typename: "RuntimeRequest", ...request });
  }
  for (const request of t.requests.values()) {
    const gone = request.requestStatus === "PENDING" && !pending.has(request.id);
    if (gone && current(t.requests, request.id)) request.requestStatus = "ANSWERED";
  }
  for (const checkpoint of thread.checkpoints.nodes) {
    if (current(t.checkpoints, checkpoint.id)) upsert(t, { __typename: "Checkpoint", ...checkpoint });
  }
  t.lineage = thread.lineage;
  t.usage = thread.threadUsage;
  t.budgets = thread.budgets || [];
  const listed = state.threads.get(t.id);
  if (listed) listed.status = thread.threadStatus;
}

// ---- rendering ---------------------------------------------------------------------------------------
let renderQueued = false;
function scheduleRender() {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    render();
  });
}

function render() {
  const t = state.t;
  if (!t) return;
  const info = t.info || {};
  $("thread-title").textContent = info.threadTitle || "";
  $("thread-status").replaceChildren(statusBadge(info.threadStatus));
  $("thread-status").dataset.status = info.threadStatus || "";
  $("queue-held").textContent = info.queueHeld ? `queue held${info.queueHoldReason ? ` (${info.queueHoldReason})` : ""}` : "";
  $("resume-queue").hidden = !info.queueHeld;
  renderLease(t);
  $("thread-cost").textContent = t.usage && t.usage.calls ? `cost ${cost(t.usage)}` : "";
  renderBudgets(t);
  renderLineage(t);
  renderRequests(t);
  renderTodo(t);
  renderMessages(t);
  renderRuns(t);
  renderQueue(t);
  renderCheckpoints(t);
  renderActivities(t);
  renderThreads();
}

// A cost in words: dollars, or "unknown" (a call nobody priced), never a zero standing for unknown.
function cost(usage) {
  if (!usage || !usage.calls) return "$0";
  if (usage.costUsd === null || usage.costUsd === undefined) return "unknown";
  return `$${usage.costUsd < 0.01 ? usage.costUsd.toPrecision(2) : usage.costUsd.toFixed(2)}`;
}

function renderBudgets(t) {
  $("budgets").replaceChildren(...t.budgets.map((b) => {
    const spent = b.budgetSpent;
    const limits = [];
    if (b.maxCostUsd !== null) limits.push(`${spent ? cost(spent) : "—"} of $${b.maxCostUsd}`);
    if (b.maxTokens !== null) limits.push(`${spent ? spent.inputTokens + spent.outputTokens : "—"} of ${b.maxTokens} tokens`);
    return h("li", { className: "budget", "data-id": b.id, "data-exceeded": b.exceeded ? "true" : "false" },
      `${b.window.toLowerCase()} budget: ${limits.join(", ")} · ${b.action.toLowerCase()}`,
      b.exceeded ? h("strong", { className: "exceeded" }, " · exceeded") : null);
  }));
  $("budgets").hidden = !t.budgets.length;
}

function renderLineage(t) {
  const lineage = t.lineage;
  const parts = [];
  if (lineage && lineage.parentThread) {
    parts.push(h("span", {}, `${(lineage.relationship || "").toLowerCase()} of `),
      h("a", { href: "#", "data-id": lineage.parentThread.id, onclick: (e) => { e.preventDefault(); selectThread(lineage.parentThread.id); } }, lineage.parentThread.title));
  }
  patch($("lineage"), parts);
  const forks = (lineage && lineage.forks.nodes) || [];
  patch($("forks"), forks.map((f) =>
    h("li", { "data-id": f.id }, h("a", { href: "#", onclick: (e) => { e.preventDefault(); selectThread(f.id); } }, f.title), statusBadge(f.status))));
}

function describeRequest(request) {
  const p = request.payload || {};
  return p.command || p.reason || p.path || (p.changes && JSON.stringify(p.changes)) || request.requestKind;
}

let renderedRequests = "";
function renderRequests(t) {
  const pending = [...t.requests.values()].filter((r) => r.requestStatus === "PENDING");
  const key = pending.map((r) => r.id).join(",");
  if (key === renderedRequests) return; // keep half-typed answers
  renderedRequests = key;
  $("requests").replaceChildren(...pending.map((request) => {
    if (request.requestKind === "USER_INPUT") return questionForm(request);
    const answer = (decision) => () => mutate("respondToApproval", { r: request.id, d: decision });
    return h("li", { className: "request", "data-id": request.id, "data-kind": request.requestKind },
      h("div", {}, statusBadge(request.requestKind), " ", h("span", { className: "what" }, describeRequest(request))),
      h("div", { className: "row" },
        h("button", { type: "button", className: "primary", onclick: answer("ACCEPT") }, "Approve"),
        h("button", { type: "button", onclick: answer("ACCEPT_FOR_SESSION") }, "Approve for session"),
        h("button", { type: "button", onclick: answer("DECLINE") }, "Decline"),
        h("button", { type: "button", onclick: answer("CANCEL") }, "Cancel")));
  }));
}

function questionForm(request) {
  const questions = (request.payload && request.payload.questions) || [];
  const fields = questions.map((q) => {
    const options = q.options || [];
    const input = options.length && !q.isOther
      ? h("select", { "data-question": q.id }, options.map((o) => h("option", { value: o.label }, o.label)))
      : h("input", { "data-question": q.id, "aria-label": q.question || q.id });
    return h("label", { className: "row" }, h("span", {}, q.question || q.header || q.id), input);
  });
  const submit = (event) => {
    event.preventDefault();
    const answers = fields.map((f) => {
      const input = f.querySelector("[data-question]");
      return { questionId: input.dataset.question, answers: [input.value] };
    });
    mutate("respondToUserInput", { r: request.id, a: answers });
  };
  return h("li", { className: "request", "data-id": request.id, "data-kind": "USER_INPUT" },
    h("form", { onsubmit: submit }, statusBadge("QUESTION"), fields, h("button", { type: "submit", className: "primary" }, "Answer")));
}

// The agent's todo list as a checklist: the newest TODO_LIST plan of a run's root turn (the thread's
// `todoList`; a subagent's own list stays under its node), updated in place as steps get done.
function renderTodo(t) {
  const ofRootTurn = (p) => {
    const node = p.node && t.nodes.get(p.node.id);
    return !node || node.nodeKind === "ROOT_TURN";
  };
  const lists = [...t.plans.values()].filter((p) => p.planKind === "TODO_LIST" && Array.isArray(p.items) && ofRootTurn(p));
  lists.sort((a, b) => (a.updatedAt < b.updatedAt ? -1 : 1));
  const newest = lists.at(-1);
  $("todo-panel").hidden = !newest;
  if (!newest) return;
  const done = newest.items.filter((i) => i.status === "completed").length;
  $("todo-count").textContent = `${done}/${newest.items.length} done`;
  $("todo").replaceChildren(...newest.items.map((item) =>
    h("li", { "data-status": item.status },
      h("input", { type: "checkbox", disabled: true, checked: item.status === "completed" ? "" : null,
        "aria-label": item.step }),
      h("span", { className: "step" }, item.step),
      item.status === "in_progress" ? h("span", { className: "muted" }, " (in progress)") : null)));
}

// Messages follow the newest one while the reader is at the bottom; scrolled up to read, they stay put.
let messagesPinned = true;
function renderMessages(t) {
  const box = $("messages");
  const messages = [...t.messages.values()].sort((a, b) => (a.createdAt < b.createdAt ? -1 : a.createdAt > b.createdAt ? 1 : 0));
  box.replaceChildren(...messages.map((m) =>
    h("li", { className: "message", "data-id": m.id, "data-role": m.role },
      h("span", { className: "role" }, m.role), clock(m.createdAt), " ",
      m.streaming ? h("span", { className: "muted" }, "writing… ") : null,
      h("span", { className: "text" }, m.text))));
  if (messagesPinned) box.scrollTop = box.scrollHeight;
}

function renderRuns(t) {
  const runs = [...t.runs.values()].sort((a, b) => b.ordinal - a.ordinal);
  const children = new Map();
  for (const node of t.nodes.values()) {
    const key = node.parent ? node.parent.id : `run:${node.nodeRun && node.nodeRun.id}`;
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(node);
  }
  const tree = (key) => {
    const nodes = (children.get(key) || []).sort((a, b) => (a.createdAt < b.createdAt ? -1 : 1));
    if (!nodes.length) return null;
    return h("ul", { className: "tree" }, nodes.map((n) =>
      h("li", { "data-node": n.id, "data-kind": n.nodeKind },
        h("div", { className: "node-head" },
          h("span", { className: "kind" }, (n.nodeKind || "").toLowerCase()), " ",
          n.nodeTitle ? h("span", { className: "node-title" }, n.nodeTitle) : null, " ", statusBadge(n.nodeStatus),
          h("span", { className: "when muted" }, clock(n.createdAt),
            n.completedAt ? h("span", { className: "took" }, ` · ${duration(n.createdAt, n.completedAt)}`) : null)),
        toolOutput(n), tree(n.id))));
  };
  patch($("runs"), runs.map((run) => {
    const stable = run.status === "COMPLETED";
    return h("div", { className: "run", "data-run": run.id, "data-ordinal": run.ordinal, "data-status": run.status },
      h("div", { className: "run-head" },
        h("strong", {}, `Run ${run.ordinal}`), statusBadge(run.status),
        run.statusReason ? h("span", { className: "muted" }, run.statusReason) : null,
        run.runUsage && run.runUsage.calls ? h("span", { className: "cost muted" }, `cost ${cost(run.runUsage)}`) : null,
        h("span", { className: "when muted" }, clock(run.startedAt || run.requestedAt),
          run.completedAt ? h("span", { className: "took" }, ` · ${duration(run.startedAt || run.requestedAt, run.completedAt)}`) : null),
        h("span", { className: "spacer" }),
        stable ? h("button", { type: "button", onclick: () => fork(run) }, "Fork") : null),
      h("div", { className: "attempts" }, (run.attempts || []).map((a) =>
        `attempt ${a.attemptOrdinal}: ${a.attemptStatus}${a.reason && a.reason !== "INITIAL" ? ` (${a.reason})` : ""}  `)),
      tree(`run:${run.id}`));
  }));
}

const openTools = new Map(); // node id → opened or closed by the reader: kept across re-renders
// A tool call's command, exit code and output (Codex's `aggregatedOutput`, Claude's `output`), folded
// away under the node; open by default when it failed. Empty output says so rather than showing nothing.
function toolOutput(node) {
  const d = node.detail;
  if (node.nodeKind !== "TOOL_CALL" || !d || typeof d !== "object") return null;
  const output = d.aggregatedOutput ?? d.output ?? "";
  const code = d.exitCode;
  const failed = code !== null && code !== undefined && code !== 0;
  const ended = code !== null && code !== undefined;
  const open = openTools.has(node.id) ? openTools.get(node.id) : failed;
  return h("details", { className: "tool", open: open ? "" : null, ontoggle: (e) => openTools.set(node.id, e.target.open) },
    h("summary", {},
      d.command ? h("code", { className: "command" }, `$ ${d.command}`) : "output",
      ended ? h("span", { className: "exit", "data-exit": code }, ` exit ${code}`) : h("span", { className: "exit muted" }, " running")),
    h("pre", { className: "output" }, output === "" ? "(no output)" : String(output)));
}

async function fork(run) {
  const payload = await mutate("forkThread", { r: run.id });
  if (payload && payload.thread) selectThread(payload.thread.id);
}

function renderQueue(t) {
  const queued = t.queue.map((id) => t.runs.get(id)).filter((run) => run && run.status === "QUEUED");
  patch($("queue"), queued.map((run, i) =>
    h("li", { "data-run": run.id },
      h("span", {}, `${i + 1}. `, (run.userMessage && run.userMessage.text) || `run ${run.ordinal}`),
      h("button", { type: "button", disabled: i === 0, "aria-label": "Move up", onclick: () => mutate("reorderQueuedRun", { r: run.id, pos: i }) }, "↑"),
      h("button", { type: "button", disabled: i === queued.length - 1, "aria-label": "Move down", onclick: () => mutate("reorderQueuedRun", { r: run.id, pos: i + 2 }) }, "↓"),
      h("button", { type: "button", onclick: () => mutate("cancelQueuedRun", { r: run.id }) }, "Cancel"))));
}

function renderCheckpoints(t) {
  // Offered while runs are rolled back; the server refuses it (shown as an error) once a run started since.
  $("undo-rollback").hidden = ![...t.runs.values()].some((run) => run.status === "ROLLED_BACK");
  const all = [...t.checkpoints.values()].sort((a, b) => b.ordinal - a.ordinal);
  const subagent = (c) => c.checkpointScope && c.checkpointScope.kind === "SUBAGENT" && c.checkpointScope.node;
  const rollback = (label, question, run) =>
    h("button", { type: "button", onclick: () => { if (confirm(question)) run(); } }, label);
  // A run's checkpoints roll the thread back; a subagent's roll back only what that subagent did.
  const runs = all.filter((c) => c.checkpointRun && !subagent(c)).map((c) =>
    h("li", { "data-id": c.id },
      `#${c.ordinal} after run ${c.checkpointRun.ordinal} `, statusBadge(c.checkpointStatus),
      c.checkpointStatus === "READY"
        ? rollback("Roll back here", `Roll the thread back to right after run ${c.checkpointRun.ordinal}?`,
            () => mutate("rollbackToRun", { t: t.id, n: c.checkpointRun.ordinal }))
        : null));
  const subagents = all.filter(subagent).map((c) => {
    const node = c.checkpointScope.node;
    const name = node.nodeTitle || "subagent";
    return h("li", { "data-id": c.id, "data-node": node.id, className: "subagent" },
      `${name} #${c.ordinal} `, statusBadge(c.checkpointStatus),
      c.checkpointStatus === "READY"
        ? rollback("Roll back subagent here", `Put back the files as they were at ${name}'s checkpoint #${c.ordinal}?`,
            () => mutate("rollbackNode", { n: node.id, c: c.id }))
        : null);
  });
  patch($("checkpoints"), [...runs, ...subagents]);
}

function renderActivities(t) {
  const sorted = [...t.activities.values()].sort((a, b) => b.sequence - a.sequence);
  const plansSeen = new Set(); // a todo list's updates: only its newest line (the checklist shows the steps)
  const activities = sorted.filter((a) => {
    if (a.activityKind !== "plan.updated") return true;
    const key = a.nodeId || a.runId || "";
    if (plansSeen.has(key)) return false;
    plansSeen.add(key);
    return true;
  }).slice(0, 100);
  $("activities").replaceChildren(...activities.map((a) =>
    h("li", { "data-sequence": a.sequence, "data-kind": a.activityKind },
      clock(a.createdAt), " ", h("span", { className: "kind" }, a.activityKind), a.summary)));
}

// ---- the writer lease: this tab drives the open thread from its first message on ------------------------
// Another device's live lease makes the server refuse this tab's writes (WRITER_LEASE_HELD, naming it); the
// header says who drives, and "Take over" moves the lease here (the other device is told on its stream).
function leaseOf(t) {
  const lease = t.info && t.info.lease;
  return lease && Date.parse(lease.expiresAt) > Date.now() ? lease : null;
}

async function drive(t, takeover = false) {
  const lease = leaseOf(t);
  if (lease && lease.deviceId === DEVICE && t.leaseTimer) return true;
  const payload = await mutate("acquireThreadLease", { t: t.id, ttl: LEASE_TTL, takeover });
  if (!payload) return false;
  t.info = { ...(t.info || {}), lease: payload.thread.lease };
  clearInterval(t.leaseTimer);
  t.leaseTimer = setInterval(() => renewLease(t), (LEASE_TTL / 3) * 1000);
  scheduleRender();
  return true;
}

async function renewLease(t) {
  const lease = leaseOf(t);
  if (state.t !== t || !lease || lease.deviceId !== DEVICE) return stopDriving(t, false); // taken over, or ran out
  try {
    const payload = (await gql(MUTATIONS.renewThreadLease, { t: t.id, ttl: LEASE_TTL })).renewThreadLease;
    if (payload.userErrors.length) stopDriving(t, false);
    else t.info = { ...(t.info || {}), lease: payload.thread.lease };
  } catch (error) {
    // offline for now: the next renewal tries again, and the lease runs out if it stays so
  }
  scheduleRender();
}

function stopDriving(t, release = true) {
  clearInterval(t.leaseTimer);
  t.leaseTimer = null;
  const lease = leaseOf(t);
  if (release && lease && lease.deviceId === DEVICE && state.token) {
    // keepalive: a release sent while the tab closes still reaches the server
    fetch(GRAPHQL, {
      method: "POST",
      keepalive: true,
      headers: { "content-type": "application/json", authorization: `Bearer ${state.token}`, "threadloom-device": DEVICE },
      body: JSON.stringify({ query: MUTATIONS.releaseThreadLease, variables: { t: t.id } }),
    }).catch(() => {});
  }
}

function renderLease(t) {
  const lease = leaseOf(t);
  const mine = lease && lease.deviceId === DEVICE;
  const box = $("lease");
  box.dataset.holder = lease ? (mine ? "you" : "other") : "none";
  box.textContent = !lease ? "" : mine ? "you are driving this thread"
    : `driven by ${lease.deviceId} (${lease.tokenName}) until ${clock(lease.expiresAt)}`;
  $("take-over").hidden = !lease || mine;
}

// ---- wiring ------------------------------------------------------------------------------------------
function dispatchInput(mode) {
  const active = state.t && state.t.info && state.t.info.activeRun;
  if (mode === "auto") return null;
  if (mode === "steerActive" || mode === "restartActive") {
    if (!active) return undefined;
    return { [mode]: { targetRunId: active.id } };
  }
  return { [mode]: true };
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const token = $("token").value.trim();
    $("token").value = "";
    if (token) signIn(token);
  });
  $("signout").addEventListener("click", () => signOut(""));
  $("messages").addEventListener("scroll", () => {
    const box = $("messages");
    messagesPinned = box.scrollHeight - box.scrollTop - box.clientHeight < 24;
  });
  $("project").addEventListener("change", (event) => {
    state.threadId = null;
    state.t = null;
    if (state.stopEvents) state.stopEvents();
    $("thread").hidden = true;
    selectProject(event.target.value);
  });
  $("new-thread").addEventListener("submit", async (event) => {
    event.preventDefault();
    const title = $("new-thread-title").value.trim() || null;
    const payload = await mutate("createThread", { p: state.projectId, title });
    if (payload && payload.thread) {
      $("new-thread-title").value = "";
      selectThread(payload.thread.id);
    }
  });
  $("send").addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = $("message").value;
    if (!text.trim() || !state.t) return;
    const d = dispatchInput($("dispatch").value);
    if (d === undefined) return showError("No active run to steer or restart.");
    if (!(await drive(state.t))) return; // another device drives it: the error names it
    const payload = await mutate("sendMessage", { t: state.t.id, text, d });
    if (payload) $("message").value = "";
  });
  $("stop").addEventListener("click", () => state.t && mutate("stopThread", { t: state.t.id }));
  $("take-over").addEventListener("click", () => state.t && drive(state.t, true));
  window.addEventListener("pagehide", () => state.t && stopDriving(state.t));
  $("resume-queue").addEventListener("click", () => state.t && mutate("resumeQueue", { t: state.t.id }));
  $("undo-rollback").addEventListener("click", () => state.t && mutate("undoRollback", { t: state.t.id }));
  if (state.token) signIn(state.token);
  else signOut("");
});
