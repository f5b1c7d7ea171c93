"""fit with several optimizers (a GAN): ``step`` and ``optimizer`` dicts, one update each per
batch, in order. On 1-3 devices, both kvstores, it trains as the plain loop on one device
(tests/tasks/gan.py), its figures are the plain loop's mean losses, a resumed run ends as
the unbroken one, and what it cannot take yet is refused with the fix."""
import functools
import math

import pytest
import torch

import dptrain
from tests.tasks import gan as g


def d_step(gan, batch):
    real, z = batch
    return g.d_loss(gan, real, z)


def g_step(gan, batch):
    real, z = batch
    return g.g_loss(gan, z)


def data(steps=5, n=16):
    batches = g.batches(steps, n)
    return torch.cat([r for r, _ in batches]), torch.cat([z for _, z in batches])


def fit_gan(gan=None, data_=None, **settings):
    gan = gan or g.GAN()
    optimizers = {"discriminator": g.adam(gan.discriminator), "generator": g.adam(gan.generator)}
    settings = {"epochs": 1, "batch_size": 16, "shuffle": False, "log": None, "progress": False, **settings}
    result = dptrain.fit(gan, data_ or data(), step={"discriminator": d_step, "generator": g_step},
                         optimizer=optimizers, **settings)
    return gan, result, optimizers


def plain_losses(batches):
    """The plain loop's two losses on each batch, as it trains (each before its update)."""
    gan = g.GAN()
    opt_d, opt_g = g.adam(gan.discriminator), g.adam(gan.generator)
    losses = []
    for real, z in batches:
        opt_d.zero_grad()
        d = g.d_loss(gan, real, z)
        d.backward()
        opt_d.step()
        opt_g.zero_grad()
        gl = g.g_loss(gan, z)
        gl.backward()
        opt_g.step()
        losses.append((d.item(), gl.item()))
    return losses


def plain_figures(batches):
    """The plain loop's mean losses over the batches (of equal sizes)."""
    losses = plain_losses(batches)
    return sum(d for d, _ in losses) / len(losses), sum(gl for _, gl in losses) / len(losses)


def assert_same(got, want, **tol):
    for (name, p), q in zip(got.named_parameters(), want.parameters()):
        torch.testing.assert_close(p, q, msg=name, **tol)


@pytest.mark.parametrize("kvstore", ["device", "local"])
@pytest.mark.parametrize("devices", [1, 2, 3])
def test_a_gan_trains_as_the_plain_loop_on_n_devices(devices, kvstore):
    gan, result, optimizers = fit_gan(devices=devices, kvstore=kvstore)
    assert_same(gan, g.plain_loop())
    row = result["history"][0]
    d, gl = plain_figures(g.batches())
    assert row["train_discriminator_loss"] == pytest.approx(d, rel=1e-5)
    assert row["train_generator_loss"] == pytest.approx(gl, rel=1e-5)
    assert row["train_loss"] == pytest.approx(d + gl, rel=1e-5)
    # The user's optimizers end with the state training reached (5 Adam steps each).
    for opt in optimizers.values():
        assert all(int(s["step"]) == 5 for s in opt.state.values()) and len(opt.state) == 4
    assert result["optimizer"] == "discriminator: Adam, generator: Adam"


def test_the_epoch_line_names_each_update():
    lines = []
    fit_gan(devices=2, log=lines.append)
    assert lines[0].startswith("epoch 1, ") and "train discriminator loss" in lines[0] \
        and "train generator loss" in lines[0], lines


def test_an_uneven_last_batch_and_sum_losses_train_as_the_plain_loop():
    """13 samples a batch on 2 devices (parts of 7 and 6) and a last batch of 2 out of 80: the
    losses are summed on each device and divided once by the global batch."""
    real, z = data()
    want = g.plain_loop([(real[i:i + 13], z[i:i + 13]) for i in range(0, 80, 13)])
    gan, _, _ = fit_gan(data_=(real, z), devices=2, batch_size=13)
    assert_same(gan, want)


def test_a_resumed_run_ends_as_the_unbroken_one(tmp_path):
    """Cut after 3 batches of the second epoch (max_steps 8 of 10), then resumed to the end:
    the weights, both optimizers' states and the last row are the unbroken run's."""
    sched = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=3, gamma=0.5)
    whole, result, _ = fit_gan(devices=2, epochs=2, scheduler=sched, scheduler_interval="batch")
    cut, _, _ = fit_gan(devices=2, epochs=2, max_steps=8, scheduler=sched, scheduler_interval="batch",
                        checkpoint_dir=str(tmp_path))
    resumed, again, optimizers = fit_gan(cut, devices=1, epochs=2, scheduler=sched, scheduler_interval="batch",
                                         checkpoint_dir=str(tmp_path), resume=True)
    assert_same(resumed, whole, rtol=1e-5, atol=1e-6)
    for key in ("train_discriminator_loss", "train_generator_loss"):
        assert again["history"][-1][key] == pytest.approx(result["history"][-1][key], rel=1e-5)
    # 10 StepLR steps: lr 1e-2 halved 3 times, for each optimizer
    assert [grp["lr"] for opt in optimizers.values() for grp in opt.param_groups] == [1.25e-3, 1.25e-3]


def test_a_scheduler_for_one_update_only():
    gan, _, optimizers = fit_gan(devices=2, epochs=2, scheduler={
        "generator": functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.1)})
    assert optimizers["generator"].param_groups[0]["lr"] == pytest.approx(1e-4)
    assert optimizers["discriminator"].param_groups[0]["lr"] == 1e-2


def test_a_skipped_update_leaves_its_parameters_and_the_batch_uncounted():
    """on_nan="skip": the generator's loss is NaN on batch 3, so its update is skipped (the
    discriminator's of that batch is made, as the plain loop that skips a NaN step would)."""
    calls = []

    def nan_once(gan, batch):
        calls.append(1)
        loss = g_step(gan, batch)
        return loss * math.nan if len(calls) == 3 else loss
    gan = g.GAN()
    result = dptrain.fit(gan, data(), step={"discriminator": d_step, "generator": nan_once},
                         optimizer={"discriminator": g.adam(gan.discriminator), "generator": g.adam(gan.generator)},
                         epochs=1, batch_size=16, shuffle=False, devices=1, on_nan="skip", log=None, progress=False)
    want = g.GAN()
    opt_d, opt_g = g.adam(want.discriminator), g.adam(want.generator)
    for b, (real, z) in enumerate(g.batches()):
        opt_d.zero_grad()
        g.d_loss(want, real, z).backward()
        opt_d.step()
        if b != 2:
            opt_g.zero_grad()
            g.g_loss(want, z).backward()
            opt_g.step()
    assert_same(gan, want)
    assert result["history"][0]["skipped"] == 1 and result["skipped_batches"] == 1


def test_devices_auto_measures_a_copy_with_its_own_optimizers():
    gan, result, _ = fit_gan(devices="auto", batch_size=16)
    assert_same(gan, g.plain_loop(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("settings, said", [
    ({"optimizer": {"d": torch.optim.Adam, "g": torch.optim.Adam}}, "optimizer['d'] must be an optimizer built on the parameters"),
    ({"step": {"d": d_step}}, "step and optimizer must name the same updates"),
    ({"step": {"d": d_step, "g": g_step}, "optimizer": "adam"}, "give step={name: fn(model, batch) -> loss}"),
    ({"lr": 0.1}, "lr: not taken with several optimizers (set each optimizer's own lr"),
    ({"train_metrics": True}, "train_metrics: not taken with several optimizers"),
    ({"compile": True}, "compile: not taken with several optimizers"),
])
def test_what_several_optimizers_cannot_take_is_refused_with_the_fix(settings, said):
    gan = g.GAN()
    kw = {"step": {"d": d_step, "g": g_step}, "optimizer": {"d": g.adam(gan.discriminator), "g": g.adam(gan.generator)},
          "epochs": 1, "batch_size": 16, "devices": 1, "log": None, **settings}
    with pytest.raises((ValueError, TypeError)) as e:
        dptrain.fit(gan, data(), **kw)
    assert said in str(e.value)


def accumulating_loop(batches, k):
    """The plain loop in Accelerate's ``accumulate``: each micro-batch runs both steps in turn
    (only the generator's parameters take the generator's gradients, as toggled), and the
    optimizers step on a group's last micro-batch, over the group's mean; the losses' means."""
    gan = g.GAN()
    opt_d, opt_g = g.adam(gan.discriminator), g.adam(gan.generator)
    sums = [0.0, 0.0]
    for start in range(0, len(batches), k):
        group = batches[start:start + k]
        for j, (real, z) in enumerate(group):
            d = g.d_loss(gan, real, z)
            (d / len(group)).backward()
            if j == len(group) - 1:
                opt_d.step()
                opt_d.zero_grad()
            gan.discriminator.requires_grad_(False)
            gl = g.g_loss(gan, z)
            (gl / len(group)).backward()
            gan.discriminator.requires_grad_(True)
            if j == len(group) - 1:
                opt_g.step()
                opt_g.zero_grad()
            sums = [sums[0] + d.item(), sums[1] + gl.item()]
    return gan, [total / len(batches) for total in sums]


@pytest.mark.parametrize("devices", [1, 3])
def test_accumulated_micro_batches_train_as_the_plain_loop_in_accelerates_accumulate(devices):
    """5 batches of 16 in groups of 2 (the last alone); 3 devices: parts of 6, 5 and 5."""
    want, (d, gl) = accumulating_loop(g.batches(), 2)
    gan, result, optimizers = fit_gan(accumulate_grad_batches=2, devices=[dptrain.cpu(0)] * devices)
    assert_same(gan, want, rtol=1e-5, atol=1e-6)
    row = result["history"][0]
    assert row["train_discriminator_loss"] == pytest.approx(d, rel=1e-5)
    assert row["train_generator_loss"] == pytest.approx(gl, rel=1e-5)
    for opt in optimizers.values():         # 3 updates each
        assert all(int(s["step"]) == 3 for s in opt.state.values())


def loud_d_step(gan, batch):
    """The discriminator's loss on its logits times 100 in float16: its scaled gradient
    overflows float16 until the scale has fallen (7 halvings), the generator's does not."""
    real, z = batch
    fake = gan.generator(z).detach()
    return g.bce((gan.discriminator(real).half() * 100).float(), 1.0) + \
        g.bce((gan.discriminator(fake).half() * 100).float(), 0.0)


def grad_scaler_loop(batches):
    """torch's AMP recipe for several optimizers: one GradScaler, each loss scaled and each
    optimizer stepped through it (skipped if its gradients overflowed), one update a batch."""
    gan = g.GAN()
    opt_d, opt_g = g.adam(gan.discriminator), g.adam(gan.generator)
    scaler = torch.amp.GradScaler("cpu")
    for real, z in batches:
        for opt, loss in ((opt_d, lambda: loud_d_step(gan, (real, z))), (opt_g, lambda: g.g_loss(gan, z))):
            opt.zero_grad()
            with torch.autocast("cpu", dtype=torch.float16):
                value = loss()
            scaler.scale(value).backward()
            scaler.step(opt)
        scaler.update()
    return gan, scaler.get_scale()


class LastScale(dptrain.Callback):
    def on_fit_end(self, run, result):
        self.scale = run.engine.loss_scale.scale


@pytest.mark.parametrize("devices", [1, 2])
def test_fp16_scales_every_update_as_one_grad_scaler_skipping_each_overflowing_one(devices):
    batches = g.batches(8)
    want, want_scale = grad_scaler_loop(batches)
    gan, last = g.GAN(), LastScale()
    optimizers = {"discriminator": g.adam(gan.discriminator), "generator": g.adam(gan.generator)}
    result = dptrain.fit(gan, (torch.cat([r for r, _ in batches]), torch.cat([z for _, z in batches])),
                         step={"discriminator": loud_d_step, "generator": g_step}, optimizer=optimizers,
                         amp="fp16", devices=[dptrain.cpu(0)] * devices, epochs=1, batch_size=16, shuffle=False,
                         log=None, callbacks=[last])
    # The discriminator skipped its updates while they overflowed, the generator none, and the
    # scale halved once for each batch with an overflow; every batch's losses count. On one
    # device, the GradScaler loop's steps exactly (7 skipped); on two, each device's half of
    # the gradient overflows float16 for one scale fewer (6 skipped).
    skipped = 7 if devices == 1 else 6
    assert [int(s["step"]) for s in optimizers["discriminator"].state.values()] == [8 - skipped] * 4
    assert [int(s["step"]) for s in optimizers["generator"].state.values()] == [8] * 4
    assert last.scale == 65536 / 2 ** skipped
    if devices == 1:
        assert_same(gan, want, rtol=0, atol=0)
        assert want_scale == last.scale
    assert math.isfinite(result["history"][0]["train_discriminator_loss"])


@pytest.mark.parametrize("balance, accumulate", [("1,3", 1), ("auto", 1), ("1,3", 2)])
def test_batches_split_unequally_train_as_the_plain_loop(balance, accumulate):
    """--balance on 2 devices: every update's parts of 4 and 12 of 16 (1:3), or as measured."""
    seen = []

    def d_seen(gan, batch):
        seen.append(len(batch[0]))
        return d_step(gan, batch)

    gan = g.GAN()
    optimizers = {"discriminator": g.adam(gan.discriminator), "generator": g.adam(gan.generator)}
    dptrain.fit(gan, data(), step={"discriminator": d_seen, "generator": g_step}, optimizer=optimizers,
                balance=balance, accumulate_grad_batches=accumulate, devices=[dptrain.cpu(0)] * 2, epochs=1,
                batch_size=16, shuffle=False, log=None)
    want = g.plain_loop() if accumulate == 1 else accumulating_loop(g.batches(), 2)[0]
    assert_same(gan, want, rtol=1e-5, atol=1e-6)
    if balance == "1,3":
        assert set(seen) == {4, 12}, seen


@pytest.mark.parametrize("devices", [1, 3])
def test_an_evaluation_set_is_scored_by_each_step_in_eval_mode(devices):
    """Each step's loss over the set (batches of 16 and 8; 3 devices: uneven parts), the
    weights as each epoch left them, as a plain evaluation gives; test_loss their sum."""
    test_real, test_z = data(3, 8)
    gan, result, _ = fit_gan(eval_data=(test_real, test_z), devices=[dptrain.cpu(0)] * devices)
    row = result["history"][-1]
    with torch.no_grad():
        gan.eval()
        want = {"discriminator": sum(g.d_loss(gan, test_real[k:k + 16], test_z[k:k + 16]).item() * n
                                     for k, n in ((0, 16), (16, 8))) / 24,
                "generator": sum(g.g_loss(gan, test_z[k:k + 16]).item() * n for k, n in ((0, 16), (16, 8))) / 24}
    assert row["test_discriminator_loss"] == pytest.approx(want["discriminator"], rel=1e-5)
    assert row["test_generator_loss"] == pytest.approx(want["generator"], rel=1e-5)
    assert row["test_loss"] == pytest.approx(sum(want.values()), rel=1e-5)


def test_evaluate_takes_the_steps_and_gives_each_ones_loss_as_fit_does():
    test = data(3, 8)
    gan, result, _ = fit_gan(eval_data=test)
    steps = {"discriminator": d_step, "generator": g_step}
    figures = dptrain.evaluate(gan, test, step=steps, batch_size=16, devices=2)
    assert figures == pytest.approx({k: v for k, v in result.items() if k.startswith("test_")}, rel=1e-6)
    assert set(figures) == {"test_loss", "test_discriminator_loss", "test_generator_loss"}
    with pytest.raises(TypeError, match="optimizer is None: training a dict of steps takes optimizer"):
        dptrain.fit(gan, test, step=steps, optimizer=None, log=None)


def test_steps_drawing_noise_evaluate_alike_each_time_on_two_devices():
    """Each device's draws in device order (the CPU generator is one for every thread)."""
    def noisy(gan, batch):          # (many draws between forwards: concurrent threads would mix them)
        real, _ = batch
        return sum(g.g_loss(gan, torch.randn(len(real), g.LATENT)) for _ in range(20)) / 20

    test, figures = data(32, 64), []
    for _ in range(3):
        torch.manual_seed(5)
        figures.append(dptrain.evaluate(g.GAN(), test, step={"d": d_step, "g": noisy}, batch_size=64, devices=2))
    assert figures[0] == figures[1] == figures[2]


class Adversarial(torch.nn.Module):
    """A classifier (features, head) and a critic of its features, as a domain-adversarial
    network holds them: forward gives the class logits."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features, self.head = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU()), torch.nn.Linear(16, 3)
        self.critic = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.head(self.features(x))


def classify(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


def criticise(model, batch):
    x, _ = batch
    return g.bce(model.critic(model.features(x).detach()), 1.0)


@pytest.mark.parametrize("devices", [1, 2])
def test_metrics_score_the_models_output_on_the_evaluation_set(devices):
    gen = torch.Generator().manual_seed(4)
    X, y = torch.randn(96, 6, generator=gen), torch.randint(0, 3, (96,), generator=gen)
    model = Adversarial()
    optimizers = {"classifier": torch.optim.Adam(list(model.features.parameters()) + list(model.head.parameters())),
                  "critic": torch.optim.Adam(model.critic.parameters())}

    def hits(output, target):
        return (output.argmax(1) == target).sum(), len(target)

    result = dptrain.fit(model, (X[:64], y[:64]), (X[64:], y[64:]), step={"classifier": classify, "critic": criticise},
                         optimizer=optimizers, metrics={"acc": hits}, devices=[dptrain.cpu(0)] * devices, epochs=2,
                         batch_size=16, shuffle=False, log=None)
    with torch.no_grad():
        output = model(X[64:])
        want = {"test_acc": (output.argmax(1) == y[64:]).float().mean().item(),     # ("acc": no accuracy of dptrain's)
                "test_classifier_loss": torch.nn.functional.cross_entropy(output, y[64:]).item(),
                "test_critic_loss": criticise(model, (X[64:], y[64:])).item()}
    row = result["history"][-1]
    assert {k: row[k] for k in want} == pytest.approx(want, rel=1e-5)
    assert "train_acc" not in row       # (train_metrics: refused with several optimizers)
    with pytest.raises(ValueError, match="metric name 'critic_loss' is taken by dptrain's own figures"):
        dptrain.fit(model, (X, y), step={"classifier": classify, "critic": criticise}, optimizer=optimizers,
                    metrics={"critic_loss": hits}, log=None)


class UnfreezeGenerator(dptrain.Callback):
    """Epoch 2 on: the generator's first layer trains (added to its optimizer here if ``add``)."""

    def __init__(self, add=False):
        self.add = add

    def on_epoch_start(self, run, epoch):
        if epoch == 2:
            layer = run.model.generator[0]
            layer.requires_grad_(True)
            if self.add:
                run.optimizer["generator"].add_param_group({"params": list(layer.parameters())})


@pytest.mark.parametrize("devices, add", [(1, False), (2, False), (2, True)])
def test_a_layer_unfrozen_mid_run_trains_from_then_on_as_in_the_plain_loop(devices, add):
    """The generator's first layer frozen for epoch 1, then trained; its optimizer built on
    every generator parameter (or on the others, the layer added when it is unfrozen)."""
    batches = g.batches()

    def optimizers(gan):
        gan.generator[0].requires_grad_(False)
        chosen = [p for p in gan.generator.parameters() if p.requires_grad] if add else gan.generator.parameters()
        return {"discriminator": g.adam(gan.discriminator),
                "generator": torch.optim.Adam(chosen, lr=1e-2, betas=(0.5, 0.999))}

    want = g.GAN()
    opts = optimizers(want)
    for epoch in (1, 2):
        if epoch == 2:
            want.generator[0].requires_grad_(True)
            if add:
                opts["generator"].add_param_group({"params": list(want.generator[0].parameters())})
        for real, z in batches:
            for name, loss in (("discriminator", lambda: g.d_loss(want, real, z)), ("generator", lambda: g.g_loss(want, z))):
                opts[name].zero_grad()
                want.discriminator.requires_grad_(name == "discriminator")
                loss().backward()
                want.discriminator.requires_grad_(True)
                opts[name].step()
    gan = g.GAN()
    dptrain.fit(gan, data(), step={"discriminator": d_step, "generator": g_step}, optimizer=optimizers(gan),
                callbacks=[UnfreezeGenerator(add)], devices=[dptrain.cpu(0)] * devices, epochs=2, batch_size=16,
                shuffle=False, log=None)
    assert_same(gan, want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(gan.generator[0].weight, g.GAN().generator[0].weight)      # it trained


def test_a_layer_unfrozen_that_no_optimizer_holds_is_refused():
    gan = g.GAN()
    gan.generator[0].requires_grad_(False)
    optimizers = {"discriminator": g.adam(gan.discriminator),
                  "generator": torch.optim.Adam([p for p in gan.generator.parameters() if p.requires_grad])}
    with pytest.raises(ValueError, match="in on_epoch_start: requires_grad was set on generator.0.weight"):
        dptrain.fit(gan, data(), step={"discriminator": d_step, "generator": g_step}, optimizer=optimizers,
                    callbacks=[UnfreezeGenerator()], devices=1, epochs=2, batch_size=16, log=None)


def test_step_evaluations_and_early_stopping_watch_a_steps_test_loss():
    from dptrain.callbacks import EarlyStopping
    lines = []
    stop = EarlyStopping("test_generator_loss", patience=1, restore_best_weights=True)
    _, result, _ = fit_gan(data_=data(), validation_split=0.25, eval_every_n_steps=2, epochs=4, log=lines.append,
                           callbacks=[stop], devices=1)
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 2 and all("test generator loss" in line and "test discriminator loss" in line
                                   for line in steps)
    # The generator's test loss rose from step 2 to step 4: stopped, step 2's weights back.
    assert len(result["history"]) == 1 and stop.watch.best < result["history"][0]["test_generator_loss"]
    assert result["test_generator_loss"] == pytest.approx(stop.watch.best) and stop.watch.best_step == 2
    assert any(line.startswith("restored the weights of step 2") for line in lines), lines


def test_a_parameter_in_two_optimizers_or_not_the_models_is_refused():
    gan = g.GAN()
    both = {"d": g.adam(gan.discriminator), "g": torch.optim.Adam(gan.parameters())}
    with pytest.raises(ValueError, match=r"'discriminator.0.weight' is in optimizer\['d'\] and optimizer\['g'\]"):
        dptrain.fit(gan, data(), step={"d": d_step, "g": g_step}, optimizer=both, log=None)
    other = {"d": g.adam(gan.discriminator), "g": g.adam(g.GAN().generator)}
    with pytest.raises(ValueError, match=r"optimizer\['g'\] holds a parameter of shape \(32, 4\) that is not the "):
        dptrain.fit(gan, data(), step={"d": d_step, "g": g_step}, optimizer=other, log=None)


@pytest.mark.parametrize("form", ["sum", "pairs"])
def test_steps_returning_sums_or_sum_and_count_train_as_the_plain_loop(form):
    """reduction="sum" (each step's loss summed over its part, divided once by the global
    batch), or steps returning (sum, count): the same update, the same figures."""
    def d_sum(gan, batch):
        real, z = batch
        loss = g.d_loss(gan, real, z, "sum")
        return loss if form == "sum" else (loss, len(real))

    def g_sum(gan, batch):
        real, z = batch
        loss = g.g_loss(gan, z, "sum")
        return loss if form == "sum" else (loss, len(z))
    gan = g.GAN()
    result = dptrain.fit(gan, data(), step={"discriminator": d_sum, "generator": g_sum},
                         optimizer={"discriminator": g.adam(gan.discriminator), "generator": g.adam(gan.generator)},
                         epochs=1, batch_size=16, shuffle=False, devices=2, log=None, progress=False,
                         **({"reduction": "sum"} if form == "sum" else {}))
    assert_same(gan, g.plain_loop())
    d, gl = plain_figures(g.batches())
    row = result["history"][0]
    assert row["train_discriminator_loss"] == pytest.approx(d, rel=1e-5)
    assert row["train_generator_loss"] == pytest.approx(gl, rel=1e-5)


def test_step_rows_give_each_updates_loss_over_their_window_and_resume_exactly(tmp_path):
    """log_every_n_steps=2 over 2 epochs of 5 batches: each row's train_<name>_loss is the
    plain loop's mean over its 2 updates (the row at step 6 spans the two epochs), train_loss
    their sum; a run cut at step 7 (a window open) and resumed gives the same rows."""
    rows = fit_gan(devices=2, epochs=2, log_every_n_steps=2)[1]["step_history"]
    plain = plain_losses(g.batches() * 2)
    assert [r["step"] for r in rows] == [2, 4, 6, 8, 10]
    for r in rows:
        window = plain[r["step"] - 2:r["step"]]
        assert r["train_discriminator_loss"] == pytest.approx(sum(d for d, _ in window) / 2, rel=1e-5)
        assert r["train_generator_loss"] == pytest.approx(sum(gl for _, gl in window) / 2, rel=1e-5)
        assert r["train_loss"] == pytest.approx(r["train_discriminator_loss"] + r["train_generator_loss"])
        assert r["lr_discriminator"] == r["lr_generator"] == 1e-2 and "lr" not in r
    cut = fit_gan(devices=2, epochs=2, log_every_n_steps=2, max_steps=7, checkpoint_dir=str(tmp_path))[0]
    again = fit_gan(cut, devices=1, epochs=2, log_every_n_steps=2, checkpoint_dir=str(tmp_path), resume=True)[1]
    assert len(again["step_history"]) == len(rows)
    for got, want in zip(again["step_history"], rows):
        assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], rel=1e-5) for k in want), (got, want)


def plain_norms(batches, max_norm=math.inf):
    """The plain loop's gradient norm in each update (``clip_grad_norm_`` over that optimizer's
    parameters, clipping them to ``max_norm``): (discriminator's, generator's) per batch."""
    gan = g.GAN()
    opt_d, opt_g = g.adam(gan.discriminator), g.adam(gan.generator)
    norms = []
    for real, z in batches:
        opt_d.zero_grad()
        g.d_loss(gan, real, z).backward()
        d = torch.nn.utils.clip_grad_norm_(gan.discriminator.parameters(), max_norm)
        opt_d.step()
        opt_g.zero_grad()
        g.g_loss(gan, z).backward()
        gn = torch.nn.utils.clip_grad_norm_(gan.generator.parameters(), max_norm)
        opt_g.step()
        norms.append((d.item(), gn.item()))
    return gan, norms


@pytest.mark.parametrize("devices, max_norm", [(1, None), (2, 0.5)])
def test_log_grad_norm_gives_each_updates_norm_and_clipping_clips_each(devices, max_norm):
    """Each row's grad_norm_<name>: that update's gradient norm before clipping, as the plain
    loop's clip_grad_norm_ over its optimizer's parameters; "parameters": each one's too."""
    want, norms = plain_norms(g.batches(), max_norm or math.inf)
    gan, result, _ = fit_gan(devices=devices, log_every_n_steps=1, log_grad_norm="parameters",
                             **({"clip_grad_norm": max_norm} if max_norm else {}))
    assert_same(gan, want, rtol=1e-5, atol=1e-6)
    rows = result["step_history"]
    assert len(rows) == len(norms)
    for row, (d, gn) in zip(rows, norms):
        assert row["grad_norm_discriminator"] == pytest.approx(d, rel=1e-5)
        assert row["grad_norm_generator"] == pytest.approx(gn, rel=1e-5)
        assert "grad_norm" not in row
        parts = [v for k, v in row.items() if k.startswith("grad_norm/discriminator.")]
        assert len(parts) == 4 and math.sqrt(sum(v * v for v in parts)) == pytest.approx(d, rel=1e-5)
        assert len([k for k in row if k.startswith("grad_norm/generator.")]) == 4


@pytest.mark.parametrize("devices", [2, 3])
def test_a_gan_with_batchnorm_and_sync_batchnorm_trains_as_the_plain_loop(devices):
    """DCGAN's BatchNorm in both networks, statistics over the whole batch: N devices train as
    one does (float64: per-device statistics would be off by ~0.1)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        want = g.plain_loop([(r.double(), z.double()) for r, z in g.batches()], batchnorm=True)
        real, z = data()
        gan, _, _ = fit_gan(g.GAN(batchnorm=True), (real.double(), z.double()), devices=devices, sync_batchnorm=True)
    finally:
        torch.set_default_dtype(before)
    assert isinstance(gan.generator[1], torch.nn.BatchNorm1d)      # its own layers, given back
    for (name, p), q in zip(gan.state_dict().items(), want.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-7, atol=1e-8, msg=name)
