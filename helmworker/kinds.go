package main

import (
	"context"
	"errors"
	"net"
	"strings"

	"helm.sh/helm/v4/pkg/storage/driver"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// Kind is what sort of failure an answer's error is, told by the worker, which sees helm's
// and client-go's errors as values; krypton branches on it, never on the words.
type Kind string

const (
	KindFailed         Kind = "failed"         // anything below does not say
	KindRecordChanged  Kind = "recordChanged"  // a record is not what krypton judged (S7)
	KindAnswerTooLarge Kind = "answerTooLarge" // the cluster answered past AnswerLimit
	KindCancelled      Kind = "cancelled"      // krypton cancelled the request
	KindTimeout        Kind = "timeout"        // helm's --timeout passed
	KindBusy           Kind = "busy"           // another helm operation holds the release
	KindNotFound       Kind = "notFound"       // the release has no record
	KindConflict       Kind = "conflict"       // fields or objects another owner holds
	KindForbidden      Kind = "forbidden"      // 401 or 403
	KindUnreachable    Kind = "unreachable"    // no answer: connection, TLS, redirect
	KindInvalid        Kind = "invalid"        // the chart or the values, or the request
)

// invalid marks an error of the chart, the values or the request itself.
type invalid struct{ error }

func (e invalid) Unwrap() error { return e.error }

// kindOf tells err's kind; ctx is the request's, ledger its records' (nil without one).
func kindOf(ctx context.Context, err error, l *ledger) Kind {
	var tooLarge *TooLarge
	var changed *RecordChanged
	var redirected *Redirected
	var netErr net.Error
	var bad invalid
	switch {
	case l.changed() != nil, errors.As(err, &changed):
		return KindRecordChanged
	case errors.As(err, &tooLarge):
		return KindAnswerTooLarge
	case errors.Is(ctx.Err(), context.Canceled):
		return KindCancelled
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.As(err, &bad):
		return KindInvalid
	case errors.Is(err, driver.ErrReleaseNotFound):
		return KindNotFound
	case apierrors.IsForbidden(err), apierrors.IsUnauthorized(err):
		return KindForbidden
	case apierrors.IsConflict(err):
		return KindConflict
	case errors.As(err, &redirected), errors.As(err, &netErr):
		return KindUnreachable
	}
	// helm's own words where its errors are not values of their own
	text := err.Error()
	switch {
	case strings.Contains(text, "changed since krypton read it"):
		return KindRecordChanged // a RecordChanged that helm wrapped without %w
	case strings.Contains(text, "another operation (install/upgrade/rollback) is in progress"):
		return KindBusy
	case strings.Contains(text, "exists and cannot be imported into the current release"),
		strings.Contains(text, "conflict occurred while applying"):
		return KindConflict
	case strings.Contains(text, "context deadline exceeded"):
		return KindTimeout
	case strings.Contains(text, "parse error"), strings.Contains(text, "template: "),
		strings.Contains(text, "values don't meet the specifications of the schema"):
		return KindInvalid
	}
	return KindFailed
}
