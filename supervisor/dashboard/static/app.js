// Refresh the #live part of the page every data-refresh seconds while it is visible, without
// a reload (no scroll jump, no lost focus in the header's search box).
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) { return; }
  var every = Math.max(2, parseInt(live.getAttribute("data-refresh"), 10) || 5) * 1000;
  function refresh() {
    if (document.visibilityState !== "visible") { return; }
    // the header: a refresh is not the operator's doing, and keeps no login from going idle
    fetch(window.location.href, {credentials: "same-origin", cache: "no-store",
                                 headers: {"X-Jobq-Refresh": "1"}})
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (!html) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("live");
        if (fresh) { live.innerHTML = fresh.innerHTML; }
      })
      .catch(function () { /* the next tick tries again */ });
  }
  window.setInterval(refresh, every);
}());

// Follow the output of the task page's attempt: every 2 s ask /api/task/ID/output for the
// bytes after the last offset (the server sends at most data-cap bytes and says how many it
// skipped); keep at most data-cap characters on the page; stop once the attempt is complete.
(function () {
  "use strict";
  var pre = document.getElementById("output");
  if (!pre) { return; }
  var url = pre.getAttribute("data-url");
  var cap = parseInt(pre.getAttribute("data-cap"), 10) || 262144;
  var status = document.getElementById("output-status");
  var skippedNote = document.getElementById("output-skipped");
  var offset = null, skipped = 0, timer = null;
  function say(text) { if (status) { status.textContent = text; } }
  function poll() {
    if (document.visibilityState !== "visible" && offset !== null) { return; }
    var q = url + (offset === null ? "" : "&offset=" + offset);
    fetch(q, {credentials: "same-origin", cache: "no-store", headers: {"X-Jobq-Refresh": "1"}})
      .then(function (r) {
        return r.json().then(function (body) { return {ok: r.ok, code: r.status, body: body}; });
      })
      .then(function (res) {
        if (!res.ok) {
          say((res.code === 503 ? "output store unavailable: " : "output: ") +
              (res.body.error || res.code));
          return;
        }
        var b = res.body;
        if (b.skipped > 0) {
          skipped += b.skipped;
          skippedNote.hidden = false;
          skippedNote.textContent = skipped + " bytes before these are not shown (jobq-ctl logs has them)";
          if (offset !== null) { pre.textContent = ""; }
        }
        if (b.data) {
          // textContent: the output is shown as text, never parsed as HTML
          var text = pre.textContent + b.data;
          if (text.length > cap) { text = text.slice(text.length - cap); }
          var atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
          pre.textContent = text;
          if (atBottom) { pre.scrollTop = pre.scrollHeight; }
        }
        offset = b.next_offset;
        if (b.complete) {
          say("complete");
          window.clearInterval(timer);
        } else {
          say(pre.textContent ? "following..." : "no output yet; following...");
        }
      })
      .catch(function () { say("output: the dashboard did not answer; trying again"); });
  }
  poll();
  timer = window.setInterval(poll, 2000);
}());
