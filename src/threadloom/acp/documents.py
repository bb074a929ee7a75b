"""The GraphQL operations the bridge sends, in one place: the bridge is an ordinary client of the public API.

Aliases keep same-named fields of different types apart where one document reads several kinds of object.
"""

from __future__ import annotations

PROJECTS = """query($after: String) { projects(first: 100, after: $after) {
  nodes { id workspaceRoot } pageInfo { hasNextPage endCursor } } }"""
PROJECT = "query($p: ID!) { project(id: $p) { id workspaceRoot } }"
CREATE = """mutation($p: ID!, $i: String) { createThread(input: {projectId: $p, providerInstanceId: $i}) {
  thread { id mode model } userErrors { code message } } }"""
# What a session is: its settings (the config options), where it works, and what runs in it now.
THREAD = """query($t: ID!) { thread(id: $t) { id latestSequence mode model providerInstanceId
  activeRun { id } project { workspaceRoot } } }"""
THREADS = """query($p: ID!, $after: String) { project(id: $p) { workspaceRoot threads(first: 50, after: $after) {
  nodes { id title updatedAt } pageInfo { hasNextPage endCursor } } } }"""
MESSAGES = """query($t: ID!, $after: String) { thread(id: $t) { messages(first: 100, after: $after) {
  nodes { role text } pageInfo { hasNextPage endCursor } } } }"""
RUNS = """query($t: ID!, $before: String) { thread(id: $t) { runs(last: 100, before: $before) {
  nodes { id ordinal status } pageInfo { hasPreviousPage startCursor } } } }"""
SEND = """mutation($t: ID!, $text: String!, $d: DispatchInput!) {
  sendMessage(input: {threadId: $t, text: $text, dispatch: $d}) {
    appliedDispatch run { id queuePosition } userErrors { code message } } }"""
RESYNC = """query($r: ID!, $t: ID!) {
  run(id: $r) { id runStatus: status statusReason
    executionGraph { nodes { id nodeKind: kind nodeStatus: status title detail } }
    plans { id planKind: kind items } }
  thread(id: $t) { latestSequence messages(last: 50) { nodes { id role text run { id } } } } }"""
# The writer lease (docs/leases.md): a session drives its thread from its first message until it is closed.
ACQUIRE = """mutation($t: ID!, $ttl: Int!) { acquireThreadLease(input: {threadId: $t, ttlSeconds: $ttl}) {
  thread { id } userErrors { code message } } }"""
RENEW = """mutation($t: ID!, $ttl: Int!) { renewThreadLease(input: {threadId: $t, ttlSeconds: $ttl}) {
  thread { id } userErrors { code message } } }"""
RELEASE = (
    """mutation($t: ID!) { releaseThreadLease(input: {threadId: $t}) { thread { id } userErrors { code message } } }"""
)
INTERRUPT = "mutation($r: ID!) { interruptRun(input: {runId: $r}) { userErrors { code message } } }"
CANCEL_QUEUED = "mutation($r: ID!) { cancelQueuedRun(input: {runId: $r}) { userErrors { code message } } }"
RESPOND = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  userErrors { code message } } }"""
ANSWER = """mutation($r: ID!, $a: [QuestionAnswer!]!) { respondToUserInput(input: {requestId: $r, answers: $a}) {
  userErrors { code message } } }"""
SET_MODE = """mutation($t: ID!, $m: RuntimeMode!) { setRuntimeMode(input: {threadId: $t, mode: $m}) {
  thread { id } userErrors { code message } } }"""
SET_MODEL = """mutation($t: ID!, $i: String!, $m: String) {
  switchProvider(input: {threadId: $t, providerInstanceId: $i, model: $m}) {
    thread { id } userErrors { code message } } }"""
FORK = """mutation($r: ID!, $w: ForkWorkspace!, $title: String) {
  forkThread(input: {source: {run: $r}, workspace: $w, title: $title}) {
    thread { id mode model } userErrors { code message } } }"""
ROLLBACK = """mutation($t: ID!, $o: Int!, $dry: Boolean!, $token: String, $files: Boolean!,
    $conflict: RollbackConflictPolicy!) {
  rollbackToRun(input: {threadId: $t, runOrdinal: $o, dryRun: $dry, previewToken: $token, restoreFiles: $files,
      onConflict: $conflict}) {
    rolledBackRuns { ordinal }
    preview { rolledBackRunOrdinals restorePaths deletePaths previewToken
      conflicts { path thread { id } run { ordinal } } providerSteps { strategy } }
    userErrors { code message } } }"""
RUN_USAGE = """query($r: ID!) { run(id: $r) {
  usage { inputTokens cachedInputTokens outputTokens reasoningTokens } } }"""
