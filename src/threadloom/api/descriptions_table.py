"""The words for types and fields whose definitions carry none (applied by `api.descriptions.describe`).

Keyed by type name (`TYPES`) and by `Type.field` (`FIELDS`); a key that names nothing in the schema fails
`tests/test_schema_descriptions.py`, so the table follows renames. docs/concepts.md explains the words used.
"""

from __future__ import annotations

TYPES: dict[str, str] = {
    # objects
    "Query": "What can be read: projects, threads and everything in them, by global id (`node`) or by path.",
    "Mutation": "What can be changed. Every mutation takes one `input` and answers a payload with `userErrors`.",
    "Subscription": (
        "Live streams over WebSocket (graphql-transport-ws) or multipart HTTP. Each resumes from a cursor or "
        "sequence, replays what was missed, then says `synchronized` and goes on live."
    ),
    "Project": "A folder on the server's machine (its workspace) and the threads that work in it.",
    "Thread": (
        "An app thread: the conversation a person sees, its runs, queue, messages and checkpoints. It runs on "
        "one provider instance at a time (docs/concepts.md)."
    ),
    "Run": (
        "One unit of work started by one user message, numbered per thread (`ordinal`). At most one run of a "
        "thread is active; the others are queued or ended."
    ),
    "RunAttempt": (
        "One try of a run on the agent. A steering restart, a recovery after a crash or `retryRun` adds another "
        "under the same run; only the run's current attempt can end it."
    ),
    "ExecutionNode": (
        "One step of a run attempt, in a tree under the attempt's root turn: a message, reasoning, a tool call, "
        "a file change, a request, a plan, a todo list or a subagent."
    ),
    "ExecutionGraph": "A run's execution graph: every node of every attempt, and the parent → child edges.",
    "ConversationMessage": "A message of the thread's conversation: the user's, the agent's, or the system's.",
    "RuntimeRequest": (
        "Something the agent asked a person mid-turn: an approval of a command, file change or permission, or a "
        "structured question. The run waits until it is answered or expires with its turn."
    ),
    "PlanArtifact": "An agent's todo list (live progress), proposed plan (start it with `implementPlan`) or questions.",
    "Budget": (
        "A spending limit on a project, or on a thread with its delegated tasks (docs/usage.md, \"Budgets\"): "
        "checked before every turn the engine starts and after every model call recorded."
    ),
    "UsageRecord": (
        "One model call an agent reported (docs/usage.md), on the attempt and node that made it: tokens by kind, "
        "the model and the cost with its source. Made once, never changed."
    ),
    "Activity": (
        "One line of a thread's history written for people (`run.started`, `approval.resolved` …), with the run "
        "and node it is about. Kinds are listed in docs/activities.md."
    ),
    "Checkpoint": (
        "The workspace's files captured at one point (before or after a run, or around a subagent), stored in "
        "the server's own shadow repository. Rollbacks and forks start from ready checkpoints."
    ),
    "CheckpointScope": (
        "What a series of checkpoints covers: a run's whole work (root scope) or one subagent's work inside it "
        "(a child scope, which `rollbackNode` restores alone)."
    ),
    "ContextTransfer": (
        "A recorded movement of context between threads or provider threads: a fork, a merge-back, a provider "
        "handoff, a delegated task's start or its result."
    ),
    "ContextHandoff": (
        "The text an agent is given about runs it did not see (after a provider switch, fork, merge-back or "
        "rollback), delivered with the target run's turn (docs/lifecycles/handoffs.md)."
    ),
    "Lineage": "Where a thread comes from: its parent (a fork's source or a delegated task's parent) and root.",
    "ProviderSession": "One live agent process (or connection) of a provider instance, shared by threads.",
    "ProviderThread": (
        "The agent's own conversation for an app thread. Its native id is what a new agent process resumes; an "
        "app thread can own several over its life (a provider switch, a replacement after an error)."
    ),
    "ProviderTurn": "One request to the agent inside a provider thread: the turn a run attempt sent.",
    "PageInfo": "Where a page of a connection sits, and whether there are more items before or after it.",
    "RunStatusUpdate": "A run's status as it changed, from the `runStatus` subscription.",
    "Entity": "Any object a thread event can carry: the entity as it was right after the change.",
    # inputs not tied to one mutation
    "ProviderThreadPointInput": "A point in a provider thread: the provider thread and, optionally, one of its turns.",
    "QuestionAnswer": "The answer to one question of a `USER_INPUT` request.",
    "RestartActiveInput": "Restart the active run with the message: its turn is interrupted and tried again.",
    # enums
    "AppliedDispatch": "What `sendMessage` did with the message.",
    "AttemptReason": (
        "Why an attempt was made: INITIAL (the run's first), STEERING_RESTART (a steering message restarted the "
        "turn), PROVIDER_RECOVERY (the agent process or its server was lost before anything ran), RETRY "
        "(`retryRun` on a failed run), WAKE (a delegated task's result woke an idle parent)."
    ),
    "AttemptStatus": "Where an attempt is; SUPERSEDED: a later attempt of the same run replaced it.",
    "CheckpointFileStatus": "How a file differs between two checkpoints.",
    "CheckpointScopeKind": "ROOT_RUN: a run's whole work. SUBAGENT: one subagent's work inside a run.",
    "CheckpointStatus": (
        "READY: usable. STALE: a rollback went back past it. MISSING: there was nothing to capture (the "
        "workspace was gone). ERROR: the capture failed."
    ),
    "Decision": (
        "The answer to an approval: ACCEPT (this once), ACCEPT_FOR_SESSION (this and the same again in this "
        "session), DECLINE (the agent goes on without it), CANCEL (decline and stop the turn)."
    ),
    "HandoffStatus": (
        "PENDING until the target run's turn carries it (DELIVERED), or FAILED: never to be delivered (a rollback "
        "undid a run it tells of; the rollback's own handoff tells the kept runs instead)."
    ),
    "HandoffStrategy": (
        "What the handoff text covers: the runs since the target provider thread last saw the thread "
        "(DELTA_SINCE_TARGET_LAST_SEEN), a summary of the whole thread (FULL_THREAD_SUMMARY), or what a fork "
        "did since its source (FORK_DELTA_SUMMARY)."
    ),
    "InputIntent": (
        "How a user message reached the agent: started a turn (TURN_START), waited in the queue (QUEUED_TURN), "
        "was sent into the live turn (STEER) or restarted it (RESTART)."
    ),
    "LineageRelationship": "FORK: made by `forkThread`. SUBAGENT: a delegated task's child thread.",
    "MessageRole": "Who wrote a message: the USER, the agent (ASSISTANT), or Threadloom (SYSTEM).",
    "NodeKind": "What an execution node is.",
    "NodeStatus": "Where an execution node is; WAITING: it waits for a person (a request).",
    "PlanKind": "TODO_LIST: live progress. PROPOSED_PLAN: a plan to start with `implementPlan`. QUESTIONS: asked.",
    "PlanStatus": (
        "ACTIVE while its turn goes on; FINALIZED when the run ended; IMPLEMENTED once `implementPlan` started "
        "it; SUPERSEDED by a newer one."
    ),
    "PlanTarget": "Where `implementPlan` starts the work: a NEW_RUN on the plan's thread, or a NEW_THREAD.",
    "ProviderSessionStatus": "Where an agent process is: STARTING, READY, RUNNING a turn, STOPPED, or in ERROR.",
    "ProviderThreadStatus": (
        "ACTIVE: loaded and in use. IDLE: loaded, nothing running. NOT_LOADED: resumable by a new process. "
        "CLOSED: not used any more. ERROR: cannot be resumed (the next run replaces it)."
    ),
    "ProviderTurnStatus": "Where a provider turn is; ROLLED_BACK: a rollback took it out of the conversation.",
    "ResponseCapability": (
        "LIVE: the agent still waits for the answer. NOT_RESUMABLE: the turn that asked is gone; answering is "
        "refused with NOT_RESUMABLE."
    ),
    "RunStatus": (
        "QUEUED → PREPARING → STARTING → RUNNING (WAITING while a request is open) → COMPLETED, FAILED, "
        "INTERRUPTED or CANCELLED; ROLLED_BACK when a rollback undid it."
    ),
    "RuntimeRequestKind": "What the agent asks: approve a command, a file change or a permission, or answer questions.",
    "RuntimeRequestStatus": "PENDING until RESOLVED (answered), EXPIRED (its turn ended) or CANCELLED.",
    "ThreadStatus": "IDLE, or the status of the thread's active run; ROLLING_BACK while a rollback is carried out.",
    "TokenScope": "READ: see. OPERATE: also send messages and answer requests. ADMIN: also manage the project.",
    "TransferStatus": (
        "PENDING until its target uses it: RESOLVED_NATIVE (the agent forked its own conversation), "
        "RESOLVED_PORTABLE (a handoff summary) or CONSUMED (taken as it was: a delegated task's start or "
        "result); SUPERSEDED by a newer one, or FAILED."
    ),
    "TransferType": "What moved: a FORK, a MERGE_BACK, a PROVIDER_HANDOFF, a SUBAGENT_SPAWN or a SUBAGENT_RESULT.",
}

FIELDS: dict[str, str] = {
    "Budget.action": "What passing it does: STOP, or ASK a person (a BUDGET runtime request).",
    "ClearBudgetInput.budgetId": "The budget to clear.",
    "UsageRecord.attempt": "The attempt whose turn made the call.",
    "UsageRecord.callRef": "The provider's name for the call within its thread: a call reported twice is one.",
    "UsageRecord.model": "The model the call went to (the run's when the provider did not say); null: not named.",
    "UsageRecord.providerInstanceId": "The provider instance the run ran on.",
    "UsageRecord.inputTokens": "Input tokens of the call, cached and cache-write ones included.",
    "UsageRecord.cachedInputTokens": "Input tokens read from the prompt cache (part of inputTokens).",
    "UsageRecord.cacheWriteTokens": "Input tokens written to the prompt cache (part of inputTokens).",
    "UsageRecord.outputTokens": "Output tokens of the call, reasoning included.",
    "UsageRecord.reasoningTokens": "Reasoning tokens (part of outputTokens).",
    "UsageRecord.costSource": "REPORTED by the provider, PRICED from the price table, or UNKNOWN.",
    "Activity.sequence": "The thread event that wrote it: its place in the thread's history.",
    "Activity.summary": "One line for people, in words (`Approved: npm test`, `2/3 steps done`).",
    "ApiToken.name": "The name given when the token was made.",
    "ApiToken.revokedAt": "When it was revoked; null while it is valid.",
    "ApiToken.scope": "What the token may do.",
    "Checkpoint.ordinal": (
        "Its number in its scope. In a run's (root) scope, the ordinal of the run it holds the workspace right after "
        "(0: the baseline before the first run), whatever order the runs ran in; in a subagent's scope, 0 when the "
        "subagent started and 1 when it ended."
    ),
    "Checkpoint.ref": "Its commit in the server's shadow repository; null until captured.",
    "Checkpoint.scope": "The scope it belongs to: a run's, or a subagent's.",
    "Checkpoint.status": "Whether it can be used.",
    "CheckpointFile.binary": "True when the file is not text (no line diff).",
    "CheckpointFile.path": "The file's path relative to the workspace.",
    "CheckpointFile.status": "How the file changed.",
    "CheckpointPoint.checkpoint": "The checkpoint the point is at.",
    "CheckpointScope.advancesRunCount": "True for a run's root scope: its checkpoints are the thread's run points.",
    "CheckpointScope.kind": "A run's whole work, or a subagent's.",
    "CheckpointScope.node": "The subagent node of a child scope; null for a root scope.",
    "CheckpointScope.parentScope": "The scope this one is inside; null for a root scope.",
    "ContextHandoff.status": "Whether the target run's turn has carried it.",
    "ContextHandoff.strategy": "What the handoff text covers.",
    "ContextHandoff.targetRun": "The run whose turn carries it.",
    "ContextHandoff.tokenEstimate": "About how many model tokens the handoff text takes.",
    "ContextHandoff.transfer": "The transfer it carries, when it came from one (a fork, a merge-back).",
    "ContextTransfer.resolutionFidelity": "exact (the agent's own conversation) or summary (a handoff text).",
    "ContextTransfer.resolutionStrategy": (
        "How the target got the context: `native` (the agent forked its own conversation), `portable` (a "
        "handoff text), or a handoff strategy's name."
    ),
    "ContextTransfer.sourceThread": "The thread the context comes from.",
    "ContextTransfer.status": "Whether the target has used it, and how.",
    "ContextTransfer.targetRun": "The run that used it; null while pending.",
    "ContextTransfer.targetThread": "The thread the context goes to.",
    "ContextTransfer.type": "What moved.",
    "ConversationMessage.clientMessageId": "The client's idempotency key of `sendMessage`, when it gave one.",
    "ConversationMessage.inputIntent": "How a user message reached the agent; null for other roles.",
    "ConversationMessage.role": "Who wrote it.",
    "ConversationMessage.streaming": "True while the agent is still writing it (its `text` grows).",
    "ConversationMessage.text": "The message's text, as written so far.",
    "CreateProjectInput.name": "The project's name.",
    "CreateThreadInput.model": "The model of the thread's runs; absent: the provider instance's default.",
    "CreateThreadInput.title": 'Absent: "New thread", until the first message titles it.',
    "DelegateTaskInput.title": "The child thread's title.",
    "DispatchInput.auto": "The default: start now, steer or restart the active run if the agent can, else queue.",
    "DispatchInput.queueAfterActive": "Queue the message as the last run.",
    "DispatchInput.restartActive": "Restart the active run with this message (a new attempt of the same run).",
    "DispatchInput.startImmediately": "Start now; THREAD_BUSY when a run is active.",
    "DispatchInput.steerActive": "Send the message into the active run's live turn.",
    "EditQueuedRunInput.text": "The queued message's new text.",
    "ExecutionEdge.child": "The child node.",
    "ExecutionEdge.parent": "The parent node.",
    "ExecutionGraph.edges": "Every parent → child edge.",
    "ExecutionGraph.nodes": "Every node of every attempt of the run.",
    "ExecutionGraphEvent.type": "What happened to the node, or a marker (`synchronized`, `reload_required`).",
    "ExecutionNode.attempt": "The run attempt it belongs to.",
    "ExecutionNode.children": "Its child nodes, oldest first.",
    "ExecutionNode.completedAt": "When it ended; null while it goes on.",
    "ExecutionNode.countsForRun": "True for a root turn: only its ending can end the run (the completion barrier).",
    "ExecutionNode.detail": (
        "What the agent reported about the step, by kind: a tool call's `command`, `exitCode` and output "
        "(`aggregatedOutput` or `output`), a file change's `changes` …"
    ),
    "ExecutionNode.kind": "What the node is.",
    "ExecutionNode.parent": "The node it is under; null for a root turn.",
    "ExecutionNode.runtimeRequest": "The request of an approval or question node.",
    "ExecutionNode.status": "Where it is.",
    "ExecutionNode.title": "A short label: the command, the file, the subagent's task …",
    "ForkSourceInput.providerThread": "A provider thread, at one of its turns or its end.",
    "ForkThreadInput.source": "The stable point the fork continues from.",
    "ImplementPlanInput.planId": "The proposed plan to start.",
    "InterruptNodeInput.holdQueue": "Also hold the thread's queue (the Stop button's behaviour).",
    "Lineage.parentThread": "The fork's source, or the delegated task's parent; null for a thread of its own.",
    "Lineage.relationship": "How the thread came from its parent; null for a thread of its own.",
    "Lineage.rootThread": "The first thread of the family (itself for a thread of its own).",
    "Mutation.cancelQueuedRun": "Cancel a queued run; the ones behind it move up. RUN_NOT_QUEUED otherwise.",
    "Mutation.editQueuedRun": "Replace a queued run's message text. RUN_NOT_QUEUED otherwise.",
    "Mutation.renameThread": "Give a thread a new title.",
    "Mutation.reorderQueuedRun": "Move a queued run to another position (1 is next). RUN_NOT_QUEUED otherwise.",
    "Mutation.unarchiveThread": "Bring an archived thread back to the lists; it can run again.",
    "NodePoint.node": "The node the point is at.",
    "PageInfo.endCursor": "The cursor of the last item of this page; null for an empty page.",
    "PageInfo.hasNextPage": "Whether there are items after this page.",
    "PageInfo.hasPreviousPage": "Whether there are items before this page.",
    "PageInfo.startCursor": "The cursor of the first item of this page; null for an empty page.",
    "PlanArtifact.items": "A todo list's steps: `[{step, status}]` (status pending, in_progress, completed …).",
    "PlanArtifact.kind": "A todo list, a proposed plan, or questions.",
    "PlanArtifact.node": "The node whose turn reported it.",
    "PlanArtifact.status": "Where it is.",
    "PlanArtifact.text": "A proposed plan's text (Markdown); null for a todo list.",
    "Project.name": "The project's name.",
    "Project.threads": "The project's threads, oldest first.",
    "Project.workspaceRoot": "The project's folder on the server's machine, where its agents work.",
    "ProjectThreadUpdate.sequence": "The project feed's position of this change.",
    "ProviderCapabilities.canForkFromTurn": "The agent can fork its conversation at an earlier turn.",
    "ProviderCapabilities.canForkThread": "The agent can fork its conversation at its end.",
    "ProviderCapabilities.canReadThreadSnapshot": "The agent can give back its conversation's items.",
    "ProviderCapabilities.canRollbackThread": "The agent can drop its conversation's last turns.",
    "ProviderCapabilities.emitsTodoList": "The agent reports todo lists.",
    "ProviderCapabilities.pendingRequestsSurviveRestart": "A request pending across an agent restart can be answered.",
    "ProviderCapabilities.supportsActiveSteering": "The agent takes a message into its live turn.",
    "ProviderCapabilities.supportsInterrupt": "The agent can interrupt its live turn.",
    "ProviderCapabilities.supportsSteeringByInterruptRestart": "A steer can interrupt the turn and restart it.",
    "ProviderCapabilities.supportsStructuredQuestions": "The agent asks questions with options (USER_INPUT requests).",
    "ProviderCapabilities.supportsSubagents": "The agent runs subagents of its own (SUBAGENT nodes).",
    "ProviderInstance.capabilities": "What its driver can do natively.",
    "ProviderSession.capabilities": "What the agent process said it can do when it started.",
    "ProviderSession.lastError": "The last error of the process, when there was one.",
    "ProviderSession.providerInstanceId": "The provider instance it runs.",
    "ProviderSession.status": "Where the process is.",
    "ProviderThread.firstRunOrdinal": "The first run of the app thread that went to it.",
    "ProviderThread.forkedFrom": "The provider thread it was forked from natively, if it was.",
    "ProviderThread.lastRunOrdinal": "The last run of the app thread that went to it.",
    "ProviderThread.nativeThreadRef": "The agent's own id of the conversation; null until the agent made it.",
    "ProviderThread.providerInstanceId": "The provider instance whose agent holds it.",
    "ProviderThread.session": "The agent process it is loaded in, if any.",
    "ProviderThread.status": "Whether it is loaded, resumable or unusable.",
    "ProviderTurn.attempt": "The run attempt that sent it.",
    "ProviderTurn.completedAt": "When it ended; null while it runs.",
    "ProviderTurn.nativeTurnRef": "The agent's own id of the turn.",
    "ProviderTurn.node": "Its node (a root turn, or a subagent's).",
    "ProviderTurn.ordinal": "Its number in its provider thread.",
    "ProviderTurn.providerThread": "The provider thread it ran in.",
    "ProviderTurn.status": "Where it is.",
    "ProviderTurnPoint.providerThread": "The provider thread of the point.",
    "Query.viewer": "Who the token is: its scope and, for a project-bound token, its project.",
    "QuestionAnswer.answers": "The chosen option labels, or the typed answer.",
    "QuestionAnswer.questionId": "The question's `id` in the request's `payload.questions`.",
    "RenameThreadInput.title": "The new title (not blank, at most 200 characters).",
    "RespondToApprovalInput.decision": "The answer.",
    "RespondToUserInputInput.answers": "One answer per question.",
    "RestartActiveInput.targetRunId": "The active run to restart; if it has ended, the message becomes a new run.",
    "RevokeTokenInput.tokenId": "The token to revoke.",
    "Run.activeAttempt": "Its current attempt: the only one that can end the run.",
    "Run.attempts": "Every attempt, oldest first.",
    "Run.checkpoint": "Its root scope's checkpoint after the run, once captured.",
    "Run.completedAt": "When it ended; null while queued or active.",
    "Run.freshContext": "The run started on a new provider thread with a summary of the thread.",
    "Run.interruptRequestedAt": "When an interrupt was asked; the run ends when the agent says so.",
    "Run.model": "The model of its turn (the message's, else the thread's).",
    "Run.ordinal": "Its number in the thread: 1, 2, 3 … without gaps.",
    "Run.plans": "The plans and todo lists its turns reported.",
    "Run.providerInstanceId": "The provider instance it runs on.",
    "Run.providerThread": "The provider thread its turn went to.",
    "Run.queuePosition": "Its place in the queue (1 is next); null when not queued.",
    "Run.requestedAt": "When its message was sent.",
    "Run.rootNode": "The root turn node of its current attempt.",
    "Run.runtimeRequests": "Every approval and question its turns asked.",
    "Run.startedAt": "When it left the queue; null while queued.",
    "Run.status": "Where it is.",
    "Run.statusReason": 'Why it ended as it did, in words (the agent\'s error, "stopped by the user" …).',
    "Run.supersedesRun": "The run this one restarts (instances that restart as a new run).",
    "Run.userMessage": "The message that started it.",
    "RunAttempt.attemptOrdinal": "Its number in the run: 1, 2 …",
    "RunAttempt.completedAt": "When it ended.",
    "RunAttempt.providerTurns": "The provider turns it sent.",
    "RunAttempt.reason": "Why it was made.",
    "RunAttempt.rootNode": "Its root turn node.",
    "RunAttempt.status": "Where it is.",
    "RunAttempt.statusReason": "Why it ended as it did, in words.",
    "RunFailure.code": "Why the run failed, as a stable code.",
    "RunStatusUpdate.sequence": "The thread event of the change.",
    "RunStatusUpdate.status": "The run's status after the change.",
    "RuntimeRequest.kind": "What the agent asks.",
    "RuntimeRequest.node": "The approval or question node.",
    "RuntimeRequest.notResumableReason": "Why it can no longer be answered.",
    "RuntimeRequest.payload": (
        "What the agent asked, as it said it: `command`, `reason`, `path`, `changes`, or `questions` "
        "(`[{id, question, options}]`)."
    ),
    "RuntimeRequest.resolvedAt": "When it was answered.",
    "RuntimeRequest.response": "The answer: `{decision}` or `{answers}`.",
    "RuntimeRequest.responseCapability": "Whether the agent can still take an answer.",
    "RuntimeRequest.status": "Where it is.",
    "SendMessageInput.dispatch": "Where the message goes when a run is active; absent: `auto`.",
    "SendMessageInput.model": "The model of the run it makes; absent: the thread's.",
    "SendMessageInput.text": "The message (not blank, at most 200 000 characters).",
    "SteerActiveInput.expectedAttemptId": "EXPECTED_ATTEMPT_MISMATCH when the run moved on to another attempt.",
    "SteerActiveInput.targetRunId": "The active run to steer; if it has ended, the message becomes a new run.",
    "SwitchProviderInput.providerInstanceId": "The provider instance the thread's next runs go to.",
    "Thread.activeRun": "The run going on now; null when idle.",
    "Thread.activities": "Its history for people, oldest first.",
    "Thread.archivedAt": "When it was archived; null for a thread in the lists.",
    "Thread.lineage": "Where it comes from: a fork's source, a delegated task's parent.",
    "Thread.messages": "Its conversation, oldest first.",
    "Thread.model": "The model of its runs; null: the provider instance's default.",
    "Thread.providerInstanceId": "The provider instance its next run goes to.",
    "Thread.providerThreads": "Every provider thread it used, oldest first.",
    "Thread.queueHeld": "True when queued runs wait for `resumeQueue` (after a failure or a Stop).",
    "Thread.queueHoldReason": "Why the queue is held.",
    "Thread.runs": "Its runs, by ordinal.",
    "Thread.title": 'Its title; "New thread" until given one or titled by its first message.',
    "Thread.workspacePath": "A fork's own folder, relative to the data dir; null: the project's workspace.",
    "ThreadEvent.entity": "The entity as it was right after the change; null for markers.",
    "ThreadEvent.occurredAt": "When the change was committed; null for markers.",
    "ThreadEvent.sequence": "The thread's gapless event number; pass it as `afterSequence` to resume after it.",
    "UserError.message": "What went wrong, in words.",
    "Viewer.scope": "What the token may do.",
}
