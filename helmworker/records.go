package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedv1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Judged is one release record as krypton read and judged it right before the request (SPEC
// S7): the object's name, the revision and status its labels and body agree on, and the
// sha256 of the record as stored (the text of data.release). helm is handed a record only if
// it is exactly this, so no rewrite between krypton's look and helm's read reaches helm.
type Judged struct {
	Name     string `json:"name"`
	Revision int    `json:"revision"`
	Status   string `json:"status"`
	Digest   string `json:"digest"`
}

// RecordChanged is a record helm was about to read that is not what krypton judged: changed,
// added or relabelled since krypton read the history.
type RecordChanged struct{ Name, Why string }

func (e *RecordChanged) Error() string {
	return fmt.Sprintf("release record %s changed since krypton read it (%s)", e.Name, e.Why)
}

// Digest is the sha256 of a record's data.release as stored: the digest krypton sends.
func Digest(stored []byte) string {
	sum := sha256.Sum256(stored)
	return hex.EncodeToString(sum[:])
}

// ledger is what one request's helm may read: the records krypton judged, and the ones helm
// itself wrote during the request (those are helm's, and checked against what it wrote).
// The first record that is neither trips it, and the request fails with RecordChanged.
type ledger struct {
	mu      sync.Mutex
	known   map[string]Judged
	tripped *RecordChanged
}

func newLedger(judged []Judged) *ledger {
	l := &ledger{known: make(map[string]Judged, len(judged))}
	for _, j := range judged {
		l.known[j.Name] = j
	}
	return l
}

// check is nil when the record (object name, labels, data.release) is what the ledger holds.
func (l *ledger) check(name string, labels map[string]string, stored []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	j, ok := l.known[name]
	var why string
	switch {
	case !ok:
		why = "krypton did not read it"
	case labels["status"] != j.Status:
		why = fmt.Sprintf("status %q, krypton read %q", labels["status"], j.Status)
	case labels["version"] != strconv.Itoa(j.Revision):
		why = fmt.Sprintf("revision %q, krypton read %d", labels["version"], j.Revision)
	case Digest(stored) != j.Digest:
		why = "its content differs"
	default:
		return nil
	}
	err := &RecordChanged{Name: name, Why: why}
	if l.tripped == nil {
		l.tripped = err
	}
	return err
}

// wrote notes a record helm wrote: what helm reads of it later must be that.
func (l *ledger) wrote(name string, labels map[string]string, stored []byte) {
	revision, _ := strconv.Atoi(labels["version"])
	l.mu.Lock()
	defer l.mu.Unlock()
	l.known[name] = Judged{Name: name, Revision: revision, Status: labels["status"], Digest: Digest(stored)}
}

func (l *ledger) deleted(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.known, name)
}

// changed is the first record that did not hold, if any (nil on a nil ledger).
func (l *ledger) changed() *RecordChanged {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tripped
}

// checkedSecrets is the Secrets helm's storage driver reads through: every record it reads
// is checked against the ledger, every one it writes noted there.
type checkedSecrets struct {
	typedv1.SecretInterface
	ledger *ledger
	ctx    context.Context // the request's, for reads: a cancel ends them (helm's writes finish)
}

func (s checkedSecrets) Get(_ context.Context, name string, opts metav1.GetOptions) (*corev1.Secret, error) {
	obj, err := s.SecretInterface.Get(s.ctx, name, opts)
	if err != nil {
		return nil, err
	}
	if err := s.ledger.check(obj.Name, obj.Labels, obj.Data["release"]); err != nil {
		return nil, err
	}
	return obj, nil
}

func (s checkedSecrets) List(_ context.Context, opts metav1.ListOptions) (*corev1.SecretList, error) {
	list, err := s.SecretInterface.List(s.ctx, opts)
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		item := &list.Items[i]
		if err := s.ledger.check(item.Name, item.Labels, item.Data["release"]); err != nil {
			return nil, err
		}
	}
	return list, nil
}

func (s checkedSecrets) Create(ctx context.Context, obj *corev1.Secret, opts metav1.CreateOptions) (*corev1.Secret, error) {
	made, err := s.SecretInterface.Create(ctx, obj, opts)
	if err == nil {
		s.ledger.wrote(obj.Name, obj.Labels, obj.Data["release"])
	}
	return made, err
}

func (s checkedSecrets) Update(ctx context.Context, obj *corev1.Secret, opts metav1.UpdateOptions) (*corev1.Secret, error) {
	made, err := s.SecretInterface.Update(ctx, obj, opts)
	if err == nil {
		s.ledger.wrote(obj.Name, obj.Labels, obj.Data["release"])
	}
	return made, err
}

func (s checkedSecrets) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	err := s.SecretInterface.Delete(ctx, name, opts)
	if err == nil {
		s.ledger.deleted(name)
	}
	return err
}

// checkedConfigMaps is checkedSecrets for HELM_DRIVER=configmap.
type checkedConfigMaps struct {
	typedv1.ConfigMapInterface
	ledger *ledger
	ctx    context.Context
}

func (c checkedConfigMaps) Get(_ context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error) {
	obj, err := c.ConfigMapInterface.Get(c.ctx, name, opts)
	if err != nil {
		return nil, err
	}
	if err := c.ledger.check(obj.Name, obj.Labels, []byte(obj.Data["release"])); err != nil {
		return nil, err
	}
	return obj, nil
}

func (c checkedConfigMaps) List(_ context.Context, opts metav1.ListOptions) (*corev1.ConfigMapList, error) {
	list, err := c.ConfigMapInterface.List(c.ctx, opts)
	if err != nil {
		return nil, err
	}
	for i := range list.Items {
		item := &list.Items[i]
		if err := c.ledger.check(item.Name, item.Labels, []byte(item.Data["release"])); err != nil {
			return nil, err
		}
	}
	return list, nil
}

func (c checkedConfigMaps) Create(ctx context.Context, obj *corev1.ConfigMap, opts metav1.CreateOptions) (*corev1.ConfigMap, error) {
	made, err := c.ConfigMapInterface.Create(ctx, obj, opts)
	if err == nil {
		c.ledger.wrote(obj.Name, obj.Labels, []byte(obj.Data["release"]))
	}
	return made, err
}

func (c checkedConfigMaps) Update(ctx context.Context, obj *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error) {
	made, err := c.ConfigMapInterface.Update(ctx, obj, opts)
	if err == nil {
		c.ledger.wrote(obj.Name, obj.Labels, []byte(obj.Data["release"]))
	}
	return made, err
}

func (c checkedConfigMaps) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	err := c.ConfigMapInterface.Delete(ctx, name, opts)
	if err == nil {
		c.ledger.deleted(name)
	}
	return err
}

// driverKind is "secrets" or "configmaps" for the HELM_DRIVER values helm takes for them;
// "" for any other (whose records the worker cannot check, so it does not read them).
func driverKind(name string) string {
	switch strings.ToLower(name) {
	case "", "secret", "secrets":
		return "secrets"
	case "configmap", "configmaps":
		return "configmaps"
	}
	return ""
}
